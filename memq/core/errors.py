"""The one error tree of memq.

Every error we raise derives from :class:`MemqError`; leaves also subclass the built-in whose
meaning they share, so callers that only know Python's exceptions still catch them sensibly.
Driver errors (redis-py, openai, OSError) are wrapped at the boundary with ``raise ... from``.
"""

from __future__ import annotations


class MemqError(Exception):
    """Root of every error memq raises on purpose."""


class ConfigError(MemqError, ValueError):
    """Settings that cannot work together, or a config file that does not parse."""


class InvalidIdentifier(MemqError, ValueError):
    """A thread id, user id or agent name that memq cannot store safely."""


class InvalidMessages(MemqError, ValueError):
    """A message list whose shape memq does not understand."""


class RedisUnavailable(MemqError, ConnectionError):
    """Redis did not answer (connection refused, timeout, loading)."""

    # What went wrong in words any caller may read (authentication, permission, unreachable),
    # without Redis's own text; set where the error is made from a driver error.
    summary: str | None = None


class RedisRefused(RedisUnavailable):
    """Redis answered but refused memq: a wrong password or user (authentication), or an ACL
    user that may not run the command (permission). Retrying will not help until the settings
    change; a door says which it is."""


class TurnNotKept(RedisUnavailable):
    """Redis did not take a turn and the producer could not keep it for a later replay (its
    spool is full, or in memory in a process that may end): the caller must know."""


class StorageError(MemqError, OSError):
    """A memory document could not be read or written."""


class CorruptMemoryFile(StorageError):
    """A stored memory document does not parse; it was moved aside, never overwritten."""


class LockTimeout(StorageError, TimeoutError):
    """The per-(user, agent) lock could not be taken in time."""


class StaleClaim(MemqError):
    """A fenced save was refused: the claim the run held is no longer the current one (its lease
    expired and the context was re-queued or re-claimed, or the user was forgotten). The run's
    answer is discarded; the memory is untouched."""


class FactNotFound(MemqError, KeyError):
    """No fact with that id in the document."""

    def __str__(self) -> str:  # KeyError quotes its argument; we want the plain sentence
        return str(self.args[0]) if self.args else "fact not found"


class LLMError(MemqError):
    """The extraction model could not give a usable answer."""


class TransientLLMError(LLMError):
    """Worth retrying later: timeout, connection error, 429, 5xx."""

    def __init__(self, message: str, *, retry_after_seconds: float | None = None) -> None:
        super().__init__(message)
        self.retry_after_seconds = retry_after_seconds


class PermanentLLMError(LLMError):
    """Retrying will not help: authentication, bad request, unknown model."""


class ResponseParseError(LLMError, ValueError):
    """The model answered, but no acceptable update could be read from the answer."""


class InvalidMemoryData(MemqError, ValueError):
    """A fact or an imported document memq will not store: blank content, a confidence outside
    [0, 1], or data that is not a memory document."""


class FactEvicted(MemqError):
    """A fact added by hand was not kept: the document is at its ``max_facts`` cap and every stored
    fact ranks above the new one (the document itself is still saved)."""


class ExtractionDeadLettered(MemqError):
    """An extraction ended with its context in the dead letters. Raised by the Celery task after
    the queue is settled, so Celery, Flower and the result show FAILURE with the reason."""


class ExtractionRetryScheduled(MemqError):
    """An extraction failed and the queue holds its context for a later try (what Flower shows as
    the reason of a RETRY; the retry itself is the ticker's, never Celery's)."""


class RunDeferred(MemqError):
    """The run may not call the model before ``retry_at_ms`` (epoch ms): the shared rate limit
    or a token budget is spent. The context goes back to `due` then, with no attempt counted."""

    def __init__(
        self, message: str, *, retry_at_ms: int, reason: str, slot_ms: int | None = None
    ) -> None:
        super().__init__(message)
        self.retry_at_ms = retry_at_ms
        self.reason = reason  # "rate_limit" or "budget": the counter it adds to
        self.slot_ms = slot_ms  # a rate-limit slot reserved for the next run (None: none)


class NotFound(MemqError, LookupError):
    """The user, agent, thread or dead letter asked for does not exist: 404."""


class PayloadTooLarge(MemqError, ValueError):
    """A body, a message list or an import above the configured cap: 413."""
