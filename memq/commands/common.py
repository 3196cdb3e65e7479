"""What every sub-command shares: the lazily built settings, Redis client and storage, output
helpers, and the one error type for "you asked for something that is not there"."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

import regex

from memq.core import json_files
from memq.core.errors import MemqError
from memq.core.identity import ANONYMOUS_USER_ID, describe_user
from memq.core.settings import MemqSettings, load_settings

if TYPE_CHECKING:
    from memq.core.connection import RedisClient
    from memq.operations.service import MemqService
    from storage.base import MemoryStorage

Runner = Callable[[argparse.Namespace, "CommandContext"], int]


class CommandError(MemqError):
    """Bad input to a command (unknown user, unusable file): one line for the operator."""


class CommandContext:
    """Built once per CLI call; nothing connects until a command asks for it."""

    def __init__(self, settings: MemqSettings | None = None) -> None:
        self._settings = settings
        self._redis: RedisClient | None = None
        self._storage: MemoryStorage | None = None
        self._service: MemqService | None = None

    @property
    def settings(self) -> MemqSettings:
        if self._settings is None:
            self._settings = load_settings()
        return self._settings

    @property
    def redis(self) -> RedisClient:
        if self._redis is None:
            from memq.core.connection import redis_client

            self._redis = redis_client(self.settings, socket_timeout=3.0, max_connections=4)
        return self._redis

    @property
    def storage(self) -> MemoryStorage:
        if self._storage is None:
            from storage import get_storage

            self._storage = get_storage(self.settings, redis=self.redis)
        return self._storage

    @property
    def service(self) -> MemqService:
        """The operation layer over this call's Redis client (the CLI acts as ``LOCAL``)."""
        if self._service is None:
            from memq.operations.service import MemqService

            self._service = MemqService(self.settings, redis=self.redis)
        return self._service

    def close(self) -> None:
        if self._service is not None:
            self._service.close()
            self._service = None
        if self._redis is not None:
            self._redis.close()
            self._redis = None


def read_json_file(path: str) -> Any:
    """Parse a JSON file; a missing file or bad JSON becomes one clear line."""
    return json_files.read_json_file(path, CommandError)


# What a terminal would act on or that would hide text: control characters (ESC sequences move
# the cursor and erase lines), format characters (a bidi override reverses what follows), line
# and paragraph separators, lone surrogates (unprintable). Joiners stay: emoji need them.
_UNSHOWABLE = regex.compile(r"[[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\p{Cs}]--[\u200c\u200d]]", regex.V1)
_UNSHOWABLE_BUT_NEWLINE = regex.compile(
    r"[[\p{Cc}\p{Cf}\p{Zl}\p{Zp}\p{Cs}]--[\u200c\u200d\n]]", regex.V1
)
_NAMED_ESCAPES = {"\n": "\\n", "\r": "\\r", "\t": "\\t"}


def shown(value: object, *, keep_newlines: bool = False) -> str:
    """``value`` as text safe to print for a person: every character a terminal would act on is
    spelled as an escape (``\\x1b``, ``\\u202e``), so stored text can neither hide lines nor
    forge them. ``keep_newlines`` for a block whose line breaks are memq's own (an injected block,
    whose stored values are already one line each). JSON output never goes through this."""
    text = "" if value is None else str(value)
    pattern = _UNSHOWABLE_BUT_NEWLINE if keep_newlines else _UNSHOWABLE
    return pattern.sub(_escape, text)


def _escape(match: regex.Match[str]) -> str:
    char = match.group()
    if char in _NAMED_ESCAPES:
        return _NAMED_ESCAPES[char]
    point = ord(char)
    if point < 0x100:
        return f"\\x{point:02x}"
    return f"\\u{point:04x}" if point < 0x10000 else f"\\U{point:08x}"


def print_json(data: Any) -> None:
    json.dump(data, sys.stdout, ensure_ascii=False, indent=2, default=str)
    sys.stdout.write("\n")


def format_table(
    headers: Sequence[str], rows: Sequence[Sequence[object]], *, wrap: int = 70
) -> str:
    """A plain-text table; long cells are cut with an ellipsis so rows stay one line each, and
    every cell goes through :func:`shown`."""
    cells = [[_cell(v, wrap) for v in row] for row in rows]
    widths = [len(h) for h in headers]
    for row in cells:
        for i, value in enumerate(row):
            widths[i] = max(widths[i], _width(value))
    lines = [
        "  ".join(_pad(h, widths[i]) for i, h in enumerate(headers)).rstrip(),
        "  ".join("-" * w for w in widths),
    ]
    lines += ["  ".join(_pad(v, widths[i]) for i, v in enumerate(row)).rstrip() for row in cells]
    return "\n".join(lines)


def _cell(value: object, wrap: int) -> str:
    text = shown(value)
    return text if len(text) <= wrap else text[: wrap - 1] + "…"


def _width(text: str) -> int:
    # CJK characters take two terminal columns.
    return sum(2 if "\u2e80" <= ch <= "\uffef" else 1 for ch in text)


def _pad(text: str, width: int) -> str:
    return text + " " * (width - _width(text))


def agent_label(agent_name: str | None) -> str:
    return agent_name or "(global)"


# The anonymous user (an agent that passes no user id) has no id to type: ``default`` is the user
# literally named so. Every command that takes a user takes ``--anonymous`` instead of it.
ANONYMOUS_HELP = 'the anonymous user (no user id; DeerFlow\'s "default"), instead of USER'


def add_user_argument(
    parser: argparse.ArgumentParser,
    *,
    option: bool = False,
    optional: bool = False,
    then: str | None = None,
) -> None:
    """The user a command acts on: ``USER`` (``--user USER`` with ``option``) or ``--anonymous``;
    :func:`resolve_user` checks that exactly one was given (none is fine with ``optional``).
    ``then`` names an optional positional that follows USER (``import USER FILE``): with
    ``--anonymous`` the one word given is that, not a user."""
    if option:
        parser.add_argument("--user", default=None, help="user id (or --anonymous)")
    else:
        parser.add_argument("user", nargs="?", default=None, help="user id (or --anonymous)")
    parser.add_argument("--anonymous", action="store_true", help=ANONYMOUS_HELP)
    parser.set_defaults(user_optional=optional, user_then=then)


def resolve_user(args: argparse.Namespace) -> None:
    """Put the anonymous user's id in ``args.user`` for ``--anonymous`` (run once for every
    command, before it runs); a user and ``--anonymous`` together, or neither, is one line."""
    if not hasattr(args, "anonymous"):
        return
    if args.anonymous:
        then = args.user_then
        if then is not None and args.user is not None and getattr(args, then) is None:
            setattr(args, then, args.user)  # argparse fills USER first
            args.user = None
        if args.user is not None:
            raise CommandError("give a user id or --anonymous, not both")
        args.user = ANONYMOUS_USER_ID
    elif args.user is None and not args.user_optional:
        raise CommandError("this command needs a user id (or --anonymous for the anonymous user)")


def user_label(user_id: str, *, quoted: bool = False) -> str:
    """A user as the CLI names it: ``(anonymous)``, or the id (``quoted``: in quotes), escaped."""
    if user_id == ANONYMOUS_USER_ID:
        return describe_user(user_id)
    return shown(repr(user_id) if quoted else user_id)


def user_json(user_id: str) -> str | None:
    """A user in JSON output: the anonymous user is ``null``, as agents pass it."""
    return None if user_id == ANONYMOUS_USER_ID else user_id
