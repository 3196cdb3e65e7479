"""How a failed run is tried again: which errors are retried, after how long (exponential back-off
from ``retry_backoff_seconds``, capped, never shorter than a server's Retry-After), and which are
dead at once. Pure: the settings and the error in, milliseconds out. And what a failure is
stored and logged as: never the text it broke on, which may be the user's.
"""

from __future__ import annotations

import traceback
from dataclasses import dataclass

from memq.core.errors import LLMError, PermanentLLMError, ResponseParseError, TransientLLMError
from memq.core.settings import MemqSettings

_MAX_RETRY_AFTER_SECONDS = 3600.0  # a server asking for more than an hour is not honoured as is


def backoff_ms(
    attempts: int, settings: MemqSettings, retry_after_seconds: float | None = None
) -> int:
    """Delay before the next try after ``attempts`` earlier failures: exponential from
    ``retry_backoff_seconds``, capped, but never shorter than a server's Retry-After."""
    delay = settings.retry_backoff_seconds * (2 ** min(max(attempts, 0), 20))
    delay = min(delay, settings.retry_backoff_max_seconds)
    if retry_after_seconds is not None and retry_after_seconds > 0:
        delay = max(delay, min(retry_after_seconds, _MAX_RETRY_AFTER_SECONDS))
    return int(delay * 1000)


@dataclass(frozen=True, slots=True)
class RetryPolicy:
    """How a failed run is tried again."""

    retry: bool  # False: permanent, the context is dead at once
    honour_retry_after: bool = False  # wait at least the server's Retry-After


# The first entry the error is an instance of applies (most specific first).
RETRY_POLICIES: tuple[tuple[type[Exception], RetryPolicy], ...] = (
    (PermanentLLMError, RetryPolicy(retry=False)),
    (TransientLLMError, RetryPolicy(retry=True, honour_retry_after=True)),
    # LLMs are nondeterministic: the next answer may parse.
    (ResponseParseError, RetryPolicy(retry=True)),
    # Never lose the key: anything else is retried until max_attempts.
    (Exception, RetryPolicy(retry=True)),
)


def retry_delay_ms(exc: Exception, attempts: int, settings: MemqSettings) -> int | None:
    """Milliseconds until the next try after ``exc`` and ``attempts`` earlier failures; None when
    the error is permanent."""
    policy = next(policy for kind, policy in RETRY_POLICIES if isinstance(exc, kind))
    if not policy.retry:
        return None
    retry_after = getattr(exc, "retry_after_seconds", None) if policy.honour_retry_after else None
    return backoff_ms(attempts, settings, retry_after)


def public_reason(exc: BaseException) -> str:
    """What a failure is stored and shown as (dead letters, Flower): the error's type, and for
    the LLM errors, which memq words from the type, HTTP status and answer shape alone, their
    message. Never any other exception's text, which can quote the conversation (an endpoint's
    error body, pydantic's input in its message)."""
    if isinstance(exc, LLMError):
        return f"{type(exc).__name__}: {exc}"[:500]
    return type(exc).__name__


def content_free_traceback(exc: BaseException) -> str:
    """The traceback of an unexpected failure with each exception's message left out: where it
    broke is the operator's to see, the text it broke on may be the user's."""
    chain: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and all(current is not seen for seen in chain):
        chain.append(current)
        current = current.__cause__ or (
            None if current.__suppress_context__ else current.__context__
        )
    parts = []
    for error in reversed(chain):
        frames = "".join(traceback.format_tb(error.__traceback__))
        parts.append(f"{frames}{type(error).__module__}.{type(error).__qualname__}: (hidden)")
    return "\n-- then --\n".join(parts)
