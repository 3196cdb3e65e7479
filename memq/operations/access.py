"""Who is calling: a principal with scopes and, optionally, the user-id prefix it is bound to.

An HTTP key, an inspector session and an MCP connection each resolve to a :class:`Principal`; the
CLI, the stdio MCP server and the in-process integrations act as :data:`LOCAL` (the local
operator's own trust). The checks live here and in :mod:`memq.operations.table`, once for every
door.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from memq.core.errors import MemqError

Scope = Literal["agent", "admin"]
SCOPES: tuple[Scope, ...] = ("agent", "admin")
# What each scope allows; `admin` holds everything `agent` does.
IMPLIED: Mapping[Scope, frozenset[Scope]] = {
    "agent": frozenset({"agent"}),
    "admin": frozenset({"agent", "admin"}),
}


class Unauthorized(MemqError, PermissionError):
    """No key, or a key no one issued: 401."""


class Forbidden(MemqError, PermissionError):
    """A valid key without the scope or outside its users: 403."""


@dataclass(frozen=True, slots=True)
class Principal:
    """The caller a key stands for. ``user_prefix`` None: every user."""

    name: str
    scopes: frozenset[Scope]
    user_prefix: str | None = None
    # Bound to exactly this user: a request that names no user means this one.
    user_id: str | None = None

    def require_scope(self, scope: Scope) -> None:
        if scope not in self.scopes:
            raise Forbidden(f"key {self.name!r} lacks the {scope!r} scope")

    def reaches(self, user_id: str) -> bool:
        if self.user_id is not None:
            return user_id == self.user_id
        return self.user_prefix is None or user_id.startswith(self.user_prefix)

    def require_user(self, user_id: str) -> None:
        if self.user_id is not None and user_id != self.user_id:
            raise Forbidden(f"key {self.name!r} is bound to one user, not this one")
        if not self.reaches(user_id):
            raise Forbidden(
                f"key {self.name!r} is bound to user ids starting with {self.user_prefix!r}"
            )

    def require_all_users(self) -> None:
        """Operations that reach every user's data (queue stats, dead letters)."""
        if self.user_id is not None:
            raise Forbidden(
                f"key {self.name!r} is bound to one user; this operation spans every user"
            )
        if self.user_prefix is not None:
            raise Forbidden(
                f"key {self.name!r} is bound to user ids starting with {self.user_prefix!r}; "
                "this operation spans every user"
            )


# The local operator (CLI, stdio MCP, an agent's own process): every scope, every user.
LOCAL = Principal("local", frozenset(SCOPES))
# Without any key configured (a loopback-only server), every caller is this one.
OPEN_ACCESS = Principal("open-loopback", frozenset(SCOPES))
