"""The inspector's login: an API key exchanged once for a signed session cookie, and the CSRF
token that session carries.

The cookie holds the SHA-256 digest of the key that logged in (never the key), a random CSRF
token and the time it was issued, signed with the session secret. Every request looks the digest
up in the same :class:`~memq.server.auth.Keyring` the HTTP API uses, so a key removed from the
key file ends its sessions at the next restart, and the scopes and user-id prefix are the key's.
The cookie is ``HttpOnly`` and ``SameSite=Strict``; every POST must also carry the session's CSRF
token in its form, compared in constant time.
"""

from __future__ import annotations

import hmac
import secrets
from dataclasses import dataclass

from itsdangerous import BadSignature, URLSafeTimedSerializer

from memq.core.errors import MemqError
from memq.operations.access import OPEN_ACCESS, Forbidden, Principal
from memq.server.auth import Keyring, digest

COOKIE = "memq_ui"
CSRF_FIELD = "csrf_token"
_SALT = "memq.inspector.session"
# A login page's session (no key yet) lives long enough to type a key, not a whole shift.
_ANONYMOUS_MAX_AGE_SECONDS = 3600


class LoginRequired(MemqError, PermissionError):
    """No session, or one that expired or whose key is gone: back to the login page."""


class CsrfRefused(Forbidden):
    """A POST without the session's CSRF token: 403, nothing changed."""


@dataclass(frozen=True, slots=True)
class Session:
    """One browser's session: ``key_digest`` None until a key logged in."""

    csrf: str
    key_digest: str | None = None

    @property
    def logged_in(self) -> bool:
        return self.key_digest is not None


def new_session(key_digest: str | None = None) -> Session:
    return Session(csrf=secrets.token_urlsafe(32), key_digest=key_digest)


class SessionCodec:
    """Signs and reads session cookies with one secret."""

    def __init__(self, secret: str | bytes, max_age_seconds: int) -> None:
        self._serializer = URLSafeTimedSerializer(secret, salt=_SALT)
        self.max_age_seconds = max_age_seconds

    def dump(self, session: Session) -> str:
        return self._serializer.dumps({"c": session.csrf, "k": session.key_digest})

    def load(self, cookie: str | None) -> Session | None:
        """The session a cookie carries; None when absent, forged or expired."""
        if not cookie:
            return None
        try:
            data = self._serializer.loads(cookie, max_age=self.max_age_seconds)
        except BadSignature:
            return None
        if not isinstance(data, dict):
            return None
        csrf, key = data.get("c"), data.get("k")
        if not isinstance(csrf, str) or not csrf or not (key is None or isinstance(key, str)):
            return None
        if key is None and self._expired_anonymous(cookie):
            return None
        return Session(csrf=csrf, key_digest=key)

    def _expired_anonymous(self, cookie: str) -> bool:
        try:
            self._serializer.loads(cookie, max_age=_ANONYMOUS_MAX_AGE_SECONDS)
        except BadSignature:
            return True
        return False


def log_in(keyring: Keyring, presented: str) -> Session:
    """A fresh session for a valid key (raises :class:`~memq.server.auth.Unauthorized`).

    A new CSRF token too: a token seen before the login must not carry over."""
    keyring.resolve(presented)  # the API's own check: unknown keys raise here
    return new_session("" if keyring.open else digest(presented.strip()))


def principal_of(keyring: Keyring, session: Session | None) -> Principal:
    """Who a session stands for, looked up anew on every request."""
    if session is None or session.key_digest is None:
        raise LoginRequired("log in first")
    if keyring.open:
        return OPEN_ACCESS
    principal = keyring.by_digest.get(session.key_digest)
    if principal is None:
        raise LoginRequired("the key of this session is no longer valid")
    return principal


def check_csrf(session: Session | None, presented: object) -> Session:
    """Refuse a change whose form lacks this session's token; the session otherwise."""
    if session is None or not isinstance(presented, str) or not presented:
        raise CsrfRefused("refused: the form carries no CSRF token (reload the page)")
    if not hmac.compare_digest(presented.encode(), session.csrf.encode()):
        raise CsrfRefused("refused: the form's CSRF token is not this session's (reload the page)")
    return session
