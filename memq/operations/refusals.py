"""What a refused or failed operation tells its caller: one status and one line, the same at every
door (HTTP problem bodies, inspector error pages, MCP tool errors).

The line names what is wrong and never repeats what the caller sent beyond the error's own first
line (a body may hold a user's words); an unavailable store and an unexpected failure are told
in fixed words, their details left to the server log by type only.
"""

from __future__ import annotations

from memq.core.connection import REDIS_ERRORS
from memq.core.errors import (
    ConfigError,
    FactEvicted,
    FactNotFound,
    InvalidIdentifier,
    InvalidMemoryData,
    InvalidMessages,
    NotFound,
    PayloadTooLarge,
    RedisUnavailable,
    StorageError,
    TurnNotKept,
)
from memq.operations.access import Forbidden, Unauthorized

UNAVAILABLE = "storage unavailable; retry later"
INTERNAL = "internal error; see the server log"
_MAX_LINE = 500

# Most specific first: the first class an error is an instance of decides its status.
STATUS_OF: tuple[tuple[type[BaseException], int], ...] = (
    (Unauthorized, 401),
    (Forbidden, 403),
    (NotFound, 404),
    (FactNotFound, 404),
    (PayloadTooLarge, 413),
    (FactEvicted, 409),
    (InvalidIdentifier, 422),
    (InvalidMessages, 422),
    (InvalidMemoryData, 422),
    (RedisUnavailable, 503),
    (StorageError, 503),
    (ConfigError, 500),
)


def status_of(exc: BaseException) -> int:
    for kind, status in STATUS_OF:
        if isinstance(exc, kind):
            return status
    if isinstance(exc, REDIS_ERRORS):
        return 503
    return 500


def first_line(exc: BaseException) -> str:
    """The error's own first line (its type's name when it has no text), bounded."""
    text = str(exc).strip() or type(exc).__name__
    return text.splitlines()[0][:_MAX_LINE]


def reason(exc: BaseException) -> str:
    """The one line a caller reads for ``exc``: for an unavailable store, what is wrong
    (unreachable, authentication, permission) and, for a turn, that it was not kept."""
    status = status_of(exc)
    if isinstance(exc, TurnNotKept):
        return first_line(exc)
    if isinstance(exc, RedisUnavailable) and exc.summary:
        return f"storage unavailable: {exc.summary}"
    if status == 503:
        return UNAVAILABLE
    if status >= 500:
        return INTERNAL
    return first_line(exc)
