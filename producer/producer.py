"""The producer hook agents call after every run: fail-open, one round trip, never in the way.

``after_agent`` and ``flush`` never raise and never wait long: Redis calls carry the short
``producer_timeout_seconds``; when Redis does not answer the context goes to a bounded in-process
spool, Redis is skipped for a back-off (:mod:`producer.backoff`) so the next calls do not pay the
timeout again, and a daemon thread replays the spool once Redis answers (:mod:`producer.replay`).
A request that fails for any other reason says nothing about Redis: it never starts the back-off,
it goes to the back of the spool, and after a few failed tries it is dropped (counted as
``poisoned``), so one request that cannot be sent never holds up the others. ``enqueue`` is the
strict variant (typed errors) for the CLI and for callers that want to know.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType
from typing import Literal

from memq.core.clock import now_ms
from memq.core.connection import RedisClient, redis_client
from memq.core.errors import MemqError, RedisRefused, RedisUnavailable, TurnNotKept
from memq.core.identity import ContextKey
from memq.core.keys import KeySchema
from memq.core.settings import MemqSettings, load_settings
from producer.backoff import Backoff
from producer.enqueue import Enqueuer, EnqueueRequest, EnqueueResult, build_request
from producer.replay import SpoolReplay
from producer.spool_disk import open_spool

log = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class ProducerStats:
    """Counters since the producer was built: contexts sent on the call (``enqueued``), kept for
    later (``spooled``), sent later from the spool (``replayed``), lost to a full spool
    (``dropped``), calls refused for bad input or an unexpected failure (``errors``), requests
    dropped because they kept failing for a reason other than Redis (``poisoned``), and message
    times that could not be read, the hand-off time standing in for them (``times_dropped``)."""

    enqueued: int = 0
    spooled: int = 0
    replayed: int = 0
    dropped: int = 0
    errors: int = 0
    poisoned: int = 0
    times_dropped: int = 0


_KEYS_KEPT = 4096
_NAME_TYPES = (str, type(None))

OfferStatus = Literal["queued", "spooled", "nothing_to_remember"]


@dataclass(frozen=True, slots=True)
class Offered:
    """How a door's hand-off ended: in Redis (``queued``, with the enqueue's answer), kept in the
    spool for the replay (``spooled``: Redis did not answer), or nothing worth keeping."""

    status: OfferStatus
    context_id: str | None = None
    result: EnqueueResult | None = None
    # Spooled on disk: the turn outlives this process (the next one with the folder sends it).
    durable: bool = False
    # Why Redis did not take it (one line: unreachable, authentication, permission), if spooled.
    reason: str | None = None


_NOWHERE_TO_KEEP = (
    "this process keeps no spool on disk (give it a data folder: MEMQ_DATA_DIR or MEMQ_SPOOL_DIR)"
)


class MemoryProducer:
    """Sends each (thread, user, agent) conversation to the memq queue.

    With ``redis`` omitted, a client is built from ``settings`` with the producer's short timeouts
    (and closed by :meth:`close`); a client passed in is used as configured, so give it short
    timeouts too.
    """

    def __init__(
        self,
        settings: MemqSettings | None = None,
        redis: RedisClient | None = None,
        *,
        clock_ms: Callable[[], int] | None = None,
    ) -> None:
        self._settings = settings if settings is not None else load_settings()
        s = self._settings
        self._owns_client = redis is None
        self._redis = (
            redis
            if redis is not None
            else redis_client(s, socket_timeout=s.producer_timeout_seconds)
        )
        self._enqueue = Enqueuer(
            self._redis,
            KeySchema(s.key_prefix, s.shards),
            debounce_ms=s.debounce_ms,
            max_delay_ms=s.max_delay_ms,
            retention_ms=s.context_retention_ms,
            pending_max_bytes=s.pending_max_bytes,
            context_max_bytes=s.context_max_bytes,
            # Only on a client the producer built: a caller's pool may be shared and small.
            hold_connection=self._owns_client,
        )
        self._clock_ms = clock_ms or now_ms
        self._spool = open_spool(s)
        # Validated keys of the threads handed over lately (ids only, never text); bounded.
        self._key_of = functools.lru_cache(maxsize=_KEYS_KEPT)(ContextKey.create)
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(
            ("enqueued", "spooled", "replayed", "dropped", "errors", "poisoned", "times_dropped"),
            0,
        )
        self._backoff = Backoff()
        self._last_failure = "Redis did not answer"  # the last failure's one line, for doors
        self._replay = SpoolReplay(
            self._spool,
            self._send,
            self._backoff,
            self._count,
            spool_max_contexts=s.spool_max_contexts,
        )
        if len(self._spool):  # left on disk by a process that ended during an outage
            self._replay.ensure_running()

    # --- the agent-facing hooks
    def after_agent(
        self,
        thread_id: str,
        user_id: str | None,
        agent_name: str | None,
        messages: Iterable[object],
        *,
        trace_id: str | None = None,
    ) -> bool:
        """After an agent run: enqueue the thread (debounced). True when Redis took it."""
        return self._submit(thread_id, user_id, agent_name, messages, False, trace_id)

    def flush(
        self,
        thread_id: str,
        user_id: str | None,
        agent_name: str | None,
        messages: Iterable[object],
        *,
        trace_id: str | None = None,
    ) -> bool:
        """Before messages disappear (summarisation): enqueue them, due now. True when Redis took
        it."""
        return self._submit(thread_id, user_id, agent_name, messages, True, trace_id)

    def enqueue(
        self,
        thread_id: str,
        user_id: str | None,
        agent_name: str | None,
        messages: Iterable[object],
        *,
        flush: bool = False,
        trace_id: str | None = None,
    ) -> EnqueueResult | None:
        """The strict variant: ``None`` when nothing is worth sending; raises InvalidIdentifier,
        InvalidMessages or RedisUnavailable (nothing is spooled then)."""
        request = self._build(thread_id, user_id, agent_name, messages, flush, trace_id)
        if request is None:
            return None
        older = self._spool.take(request.context_id)
        try:
            result = self._enqueue(
                request if older is None else older.merged_under(request), self._clock_ms()
            )
        except Exception:
            if older is not None:
                self._spool.put_back(older)
            raise
        self._spool.sent(request.context_id)
        self._count("enqueued")
        return result

    def offer(
        self,
        thread_id: str,
        user_id: str | None,
        agent_name: str | None,
        messages: Iterable[object],
        *,
        flush: bool = False,
        trace_id: str | None = None,
        keep_in_memory: bool = True,
    ) -> Offered:
        """A door's variant (HTTP, MCP): bad input raises (InvalidIdentifier, InvalidMessages);
        a Redis that does not answer spools the context, under the same back-off as the hooks,
        so a hung Redis costs one timeout per back-off, never two per call.

        A door must not promise what it may lose, so: a Redis that refuses memq (authentication,
        permission: :class:`RedisRefused`) raises, no replay helps; a spool that could not keep
        the turn (full) raises :class:`TurnNotKept`; and with ``keep_in_memory`` False (a process
        that may end any time, such as MCP over stdio) a spool that is not on disk raises
        :class:`TurnNotKept` instead of keeping it in memory."""
        request = self._build(thread_id, user_id, agent_name, messages, flush, trace_id)
        if request is None:
            return Offered("nothing_to_remember")
        durable = self._spool.folder is not None
        if not keep_in_memory and not durable and self._backoff.skipping():
            raise TurnNotKept(f"not kept: {self._last_failure}; {_NOWHERE_TO_KEEP}")
        try:
            result = self._offer(request, refuse=True, keep=keep_in_memory or durable)
        except TurnNotKept:
            raise
        except RedisRefused:
            raise  # the credentials or the ACL: no replay helps until the settings change
        except RedisUnavailable as exc:
            raise TurnNotKept(f"not kept: {self._last_failure}; {_NOWHERE_TO_KEEP}") from exc
        if result is not None:
            return Offered("queued", request.context_id, result)
        if not self._spool.holds(request.context_id):
            raise TurnNotKept(f"not kept: {self._last_failure}; the producer's spool is full")
        return Offered("spooled", request.context_id, durable=durable, reason=self._last_failure)

    # --- spool and lifecycle
    @property
    def stats(self) -> ProducerStats:
        with self._lock:
            return ProducerStats(**self._counts)

    @property
    def spool_size(self) -> int:
        return len(self._spool)

    @property
    def spool_folder(self) -> Path | None:
        """Where the spool is kept on disk (it outlives this process), or None: in memory."""
        return self._spool.folder

    def keeps(self, context_id: str) -> bool:
        """Whether a context this producer could not send is kept for a later replay (on disk
        when :attr:`spool_folder` is set)."""
        return self._spool.holds(context_id)

    def drain_spool(self) -> int:
        """Replay the spool now, in the caller's thread, ignoring the back-off; stops at the first
        failure. Returns how many contexts were replayed."""
        return self._replay.drain()

    def hand_over(self, timeout_seconds: float) -> bool:
        """Send the spool to Redis within ``timeout_seconds`` (a hard bound, for shutdown hooks).

        True only when nothing is left spooled and no replay is still sending; False when Redis
        did not take everything in time (what is left stays spooled). Once in Redis a context
        is durable, so nothing else needs draining before the process exits.
        """
        return self._replay.hand_over(timeout_seconds)

    def close(self) -> None:
        """Stop the replay thread, try one last drain (bounded by the socket timeouts), and close
        the client if the producer built it. Whatever is still spooled then is lost, unless the
        spool is on disk: the next process started with its folder replays it."""
        self._replay.close()
        self.drain_spool()
        left = len(self._spool)
        if left and self._spool.folder is not None:
            log.warning(
                "memq: closing with %d contexts still spooled in %s; the next memq process "
                "started with that folder sends them",
                left,
                self._spool.folder,
            )
        elif left:
            log.warning("memq: closing with %d contexts still spooled; they are lost", left)
        self._spool.close()
        self._enqueue.close()
        if self._owns_client:
            self._redis.close()

    def __enter__(self) -> MemoryProducer:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- internals
    def _build(
        self,
        thread_id: object,
        user_id: object,
        agent_name: object,
        messages: Iterable[object],
        flush: bool,
        trace_id: str | None,
    ) -> EnqueueRequest | None:
        if not self._settings.enabled:
            return None
        if type(thread_id) is str and type(user_id) is str and type(agent_name) in _NAME_TYPES:
            key = self._key_of(thread_id, user_id, agent_name)  # the same thread every turn
        else:
            key = ContextKey.create(thread_id, user_id, agent_name)
        request = build_request(
            key,
            messages,
            flush=flush,
            trace_id=trace_id,
            max_chars=self._settings.producer_max_chars,
            max_messages=self._settings.producer_max_messages,
            max_bytes=self._settings.context_max_bytes,
            # Stamped now, not when sent: a spooled request must never pass for a newer turn.
            captured_ms=self._clock_ms(),
        )
        if request is not None and request.times_dropped:
            self._count("times_dropped", request.times_dropped)
            log.info(
                "memq: %s: %d message times unreadable; the hand-off time stands in",
                key.describe(),
                request.times_dropped,
            )
        return request

    def _submit(
        self,
        thread_id: object,
        user_id: object,
        agent_name: object,
        messages: Iterable[object],
        flush: bool,
        trace_id: str | None,
    ) -> bool:
        try:
            request = self._build(thread_id, user_id, agent_name, messages, flush, trace_id)
        except MemqError as exc:
            self._count("errors")
            log.warning("memq: conversation not enqueued: %s", exc)
            return False
        except Exception:  # the agent must never see an exception from memory
            self._count("errors")
            log.exception("memq: unexpected error preparing a conversation; not enqueued")
            return False
        if request is None:
            return False
        return self._offer(request) is not None

    def _offer(
        self, request: EnqueueRequest, *, refuse: bool = False, keep: bool = True
    ) -> EnqueueResult | None:
        """Send ``request`` (merged with what the spool holds of its context), or keep it for the
        replay; None when it was kept. Never raises, but for a door (``refuse``): a Redis that
        refused memq raises :class:`RedisRefused`, and without ``keep`` an unreachable one
        raises :class:`RedisUnavailable` instead of spooling."""
        if self._backoff.skipping():
            # Redis failed just now: do not pay the timeout again.
            self._replay.keep_for_later(request)
            return None
        older = self._spool.take(request.context_id)
        if older is not None:
            request = older.merged_under(request)
        try:
            result = self._send(request)
        except RedisUnavailable as exc:
            self._last_failure = exc.summary or "Redis did not answer"
            self._replay.record_failure(exc)
            if refuse and (isinstance(exc, RedisRefused) or not keep):
                if older is not None:
                    self._spool.put_back(older)
                raise
            self._replay.keep_for_later(request)
            return None
        except Exception as exc:
            # Not the agent's problem, and not Redis failing: the replay tries it a few more times.
            self._replay.failed_unexpectedly(request, exc)
            return None
        self._count("enqueued")
        self._replay.record_recovery()
        if len(self._spool):
            self._replay.ensure_running()
        return result

    def _send(self, request: EnqueueRequest) -> EnqueueResult:
        result = self._enqueue(request, self._clock_ms())
        self._spool.sent(request.context_id)
        return result

    def _count(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._counts[name] += amount
