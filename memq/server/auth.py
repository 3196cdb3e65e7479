"""API keys, scopes and user-id prefixes: who may call which route for which user.

Keys come from a JSON file and/or the environment and are kept only as SHA-256 digests (a key is
a long random token, so a fast digest is enough and a stolen key file or heap dump gives nothing
to replay). :func:`Keyring.resolve` turns a presented key into a :class:`Principal`; every route
declares one :class:`Authorize` dependency, which resolves the ``Authorization: Bearer`` key,
checks the route's scope and, for a route under ``/users/{user_id}``, the key's user-id prefix.
A future cookie login resolves its key with the same :meth:`Keyring.resolve`.
"""

from __future__ import annotations

import hashlib
import ipaddress
import json
import logging
import os
import secrets
import threading
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.security import HTTPBearer

from memq.core.errors import ConfigError
from memq.core.identity import validate_named_user
from memq.core.settings import MemqSettings
from memq.operations.access import (
    IMPLIED,
    OPEN_ACCESS,
    SCOPES,
    Principal,
    Scope,
    Unauthorized,
)
from memq.operations.table import authorize

KEY_PREFIX = "memq_"
HTTP_ANONYMOUS_HINT = (
    "the HTTP API serves named users only (the anonymous user is the CLI's `--anonymous` and "
    "MCP's `X-Memq-Anonymous: true`)"
)
log = logging.getLogger("memq.server")


def digest(key: str) -> str:
    return hashlib.sha256(key.encode("utf-8")).hexdigest()


def new_key() -> str:
    """A fresh key: 32 random bytes, URL-safe, recognisable by its prefix in a secret scanner."""
    return KEY_PREFIX + secrets.token_urlsafe(32)


class Keyring:
    """The issued keys by digest. Empty: open access (only allowed on a loopback bind).

    Built from settings that name a key file, it follows that file: a request after the file
    changed (its mtime, size or inode) sees the new keys, so `memq api-key new` takes effect
    without a restart. A file that no longer parses, or would leave no key at all (an open
    server), keeps the keys loaded before, with a warning.
    """

    __slots__ = ("_keys", "_lock", "_settings", "_stamp")

    def __init__(
        self,
        by_digest: Mapping[str, Principal] | None = None,
        *,
        settings: MemqSettings | None = None,
    ) -> None:
        self._keys: Mapping[str, Principal] = dict(by_digest or {})
        self._settings = settings  # set: reload from its key file when that file changes
        self._stamp = _file_stamp(settings.serve_api_keys_file) if settings is not None else None
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"Keyring({len(self._keys)} keys)"

    @property
    def by_digest(self) -> Mapping[str, Principal]:
        self._follow_file()
        return self._keys

    @property
    def open(self) -> bool:
        return not self.by_digest

    def resolve(self, presented: str | None) -> Principal:
        keys = self.by_digest
        if not keys:
            return OPEN_ACCESS
        if not presented:
            raise Unauthorized("an API key is required: send `Authorization: Bearer <key>`")
        principal = keys.get(digest(presented.strip()))
        if principal is None:
            raise Unauthorized("unknown API key")
        return principal

    @classmethod
    def from_settings(cls, settings: MemqSettings) -> Keyring:
        follow = settings if settings.serve_api_keys_file is not None else None
        return cls(_load(settings), settings=follow)

    @classmethod
    def from_entries(cls, entries: Iterable[Any]) -> Keyring:
        return cls(_keys_of(entries))

    def _follow_file(self) -> None:
        settings = self._settings
        if settings is None or settings.serve_api_keys_file is None:
            return
        stamp = _file_stamp(settings.serve_api_keys_file)  # one stat per request
        if stamp == self._stamp:
            return
        with self._lock:
            if stamp == self._stamp:
                return
            self._stamp = stamp
            try:
                keys = _load(settings)
            except ConfigError as exc:
                log.warning("memq serve: key file changed but not reloaded: %s", exc)
                return
            if not keys and self._keys:
                log.warning("memq serve: key file changed to no key at all; keeping the old keys")
                return
            self._keys = keys
            log.warning("memq serve: key file reloaded (%d keys)", len(keys))


def _file_stamp(path: Path | None) -> tuple[int, int, int] | None:
    if path is None:
        return None
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _load(settings: MemqSettings) -> dict[str, Principal]:
    entries: list[Any] = []
    path = settings.serve_api_keys_file
    if path is not None:
        entries += _entries(_read(path), f"MEMQ_SERVE_API_KEYS_FILE={path}")
    if settings.serve_api_keys is not None:
        raw = settings.serve_api_keys.get_secret_value()
        entries += _entries(_parse(raw, "MEMQ_SERVE_API_KEYS"), "MEMQ_SERVE_API_KEYS")
    return _keys_of(entries)


def _keys_of(entries: Iterable[Any]) -> dict[str, Principal]:
    keys: dict[str, Principal] = {}
    names: set[str] = set()
    for index, entry in enumerate(entries):
        sha, principal = parse_entry(entry, index)
        if principal.name in names:
            raise ConfigError(f"API key {principal.name!r} is defined twice")
        names.add(principal.name)
        keys[sha] = principal
    return keys


def parse_entry(entry: Any, index: int) -> tuple[str, Principal]:
    """``{"name", "sha256" | "key", "scopes", "user_prefix"?}`` → (digest, principal)."""
    where = f"API key #{index + 1}"
    if not isinstance(entry, Mapping):
        raise ConfigError(f"{where}: must be an object with name, sha256 (or key) and scopes")
    name = entry.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ConfigError(f"{where}: needs a non-blank `name`")
    where = f"API key {name!r}"
    sha = entry.get("sha256")
    plain = entry.get("key")
    if (sha is None) == (plain is None):
        raise ConfigError(f"{where}: give exactly one of `sha256` (preferred) or `key`")
    if plain is not None:
        if not isinstance(plain, str) or len(plain) < 16:
            raise ConfigError(f"{where}: `key` must be a string of at least 16 characters")
        sha = digest(plain)
    if not isinstance(sha, str) or len(sha) != 64 or any(c not in "0123456789abcdef" for c in sha):
        raise ConfigError(f"{where}: `sha256` must be 64 lower-case hex digits")
    scopes = entry.get("scopes")
    if not isinstance(scopes, list) or not scopes or any(s not in SCOPES for s in scopes):
        raise ConfigError(f"{where}: `scopes` must be a non-empty list of {', '.join(SCOPES)}")
    granted: set[Scope] = set()
    for scope in scopes:
        granted |= IMPLIED[scope]
    prefix = entry.get("user_prefix")
    if prefix is not None and (not isinstance(prefix, str) or not prefix):
        raise ConfigError(f"{where}: `user_prefix` must be a non-empty string or absent")
    user = entry.get("user")
    if user is not None and (not isinstance(user, str) or not user or prefix is not None):
        raise ConfigError(f"{where}: `user` must be a non-empty string, and not with user_prefix")
    return sha, Principal(name.strip(), frozenset(granted), prefix, user)


def _read(path: Path) -> Any:
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError(f"MEMQ_SERVE_API_KEYS_FILE={path}: cannot read it: {exc}") from exc
    return _parse(text, f"MEMQ_SERVE_API_KEYS_FILE={path}")


def _parse(text: str, where: str) -> Any:
    try:
        return json.loads(text)
    except ValueError as exc:
        # The text may hold plain keys: never repeat it, only where it failed.
        raise ConfigError(f"{where}: not JSON (line {getattr(exc, 'lineno', '?')})") from None


def _entries(data: Any, where: str) -> list[Any]:
    if isinstance(data, Mapping):
        data = data.get("keys")
    if not isinstance(data, list):
        raise ConfigError(f'{where}: expected {{"keys": [...]}} or a list of keys')
    return data


def is_loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def check_bind(host: str, keyring: Keyring) -> None:
    """Refuse to serve a non-loopback address without keys: anyone on the network could read
    and erase every user's memory."""
    if keyring.open and not is_loopback(host):
        raise ConfigError(
            f"refusing to bind {host} without API keys: set MEMQ_SERVE_API_KEYS_FILE (or "
            "MEMQ_SERVE_API_KEYS), or bind 127.0.0.1"
        )


def key_file_entry(
    name: str, key: str, scopes: list[Scope], user_prefix: str | None, user: str | None = None
) -> str:
    """The line to add to the key file for a new key: its digest, never the key."""
    entry: dict[str, Any] = {"name": name, "sha256": digest(key), "scopes": scopes}
    if user_prefix is not None:
        entry["user_prefix"] = user_prefix
    if user is not None:
        entry["user"] = user
    return json.dumps(entry)


def write_private(path: Path, text: str) -> None:
    """Create or replace ``path`` readable by its owner only."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(text)


class Authorize(HTTPBearer):
    """The dependency every route declares: ``Depends(Authorize("add_fact"))``, naming the
    route's operation in :mod:`memq.operations.table`.

    ``operation=None`` marks a public route (health probes): no key needed. Otherwise the key
    is resolved and checked against the table: the operation's scope, and the ``{user_id}`` of
    the path against the key's user-id prefix (or every user, for operations that span them).
    It is FastAPI's bearer scheme itself (so the OpenAPI document names it) and reads the header
    in the same step: a sub-dependency would cost more per request than the check.
    """

    def __init__(self, operation: str | None) -> None:
        super().__init__(
            scheme_name="HTTPBearer",
            description="an API key issued by the operator",
            auto_error=False,
        )
        self.operation = operation

    def __repr__(self) -> str:
        return f"Authorize({self.operation!r})"

    async def __call__(self, request: Request) -> Principal:  # type: ignore[override]
        keyring: Keyring = request.app.state.keyring
        if self.operation is None:
            return OPEN_ACCESS
        principal = keyring.resolve(self.presented_key(request))
        user_id = request.path_params.get("user_id")
        if user_id is not None:
            # The anonymous user has no id a path may name (`%00anonymous` included).
            validate_named_user(str(user_id), ask=HTTP_ANONYMOUS_HINT)
        authorize(principal, self.operation, None if user_id is None else str(user_id))
        return principal

    def presented_key(self, request: Request) -> str | None:
        """The key the request carries: the bearer header."""
        return bearer_token(request.headers.get("authorization"))


def bearer_token(header: str | None) -> str | None:
    """The key of an ``Authorization: Bearer <key>`` header; None for anything else."""
    scheme, _, token = (header or "").partition(" ")
    return (token.strip() or None) if scheme.lower() == "bearer" else None


PUBLIC = Authorize(None)
