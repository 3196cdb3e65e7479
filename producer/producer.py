"""The producer hook agents call after every run: fail-open, one round trip, never in the way.

``after_agent`` and ``flush`` never raise and never wait long: Redis calls carry the short
``producer_timeout_seconds``; when Redis does not answer the context goes to a bounded in-process
spool, Redis is skipped for a back-off (:mod:`producer.backoff`) so the next calls do not pay the
timeout again, and a daemon thread replays the spool once Redis answers. A request that fails for
any other reason says nothing about Redis: it never starts the back-off, it goes to the back of the
spool, and after a few failed tries it is dropped (counted as ``poisoned``), so one request that
cannot be sent never holds up the others. ``enqueue`` is the strict variant (typed errors) for
the CLI and for callers that want to know.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from types import TracebackType

from memq.core.connection import RedisClient, redis_client
from memq.core.errors import MemqError, RedisUnavailable
from memq.core.identity import ContextKey
from memq.core.keys import KeySchema
from memq.core.settings import MemqSettings, load_settings
from producer.backoff import Backoff
from producer.enqueue import Enqueuer, EnqueueRequest, EnqueueResult, build_request
from producer.spool import Spool

log = logging.getLogger(__name__)

_REPLAY_BATCH = 100
# Tries of a request that fails for a reason other than Redis before it is dropped.
_MAX_UNEXPECTED_FAILURES = 3
_CLOSE_JOIN_SECONDS = 2.0
_UNEXPECTED_PAUSE_SECONDS = 0.5


@dataclass(frozen=True, slots=True)
class ProducerStats:
    """Counters since the producer was built: contexts sent on the call (``enqueued``), kept for
    later (``spooled``), sent later from the spool (``replayed``), lost to a full spool
    (``dropped``), calls refused for bad input or an unexpected failure (``errors``), and requests
    dropped because they kept failing for a reason other than Redis (``poisoned``)."""

    enqueued: int = 0
    spooled: int = 0
    replayed: int = 0
    dropped: int = 0
    errors: int = 0
    poisoned: int = 0


def _wall_clock_ms() -> int:
    return time.time_ns() // 1_000_000


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
        )
        self._clock_ms = clock_ms or _wall_clock_ms
        self._spool = Spool(s.spool_max_contexts)
        self._lock = threading.Lock()
        self._counts = dict.fromkeys(
            ("enqueued", "spooled", "replayed", "dropped", "errors", "poisoned"), 0
        )
        self._backoff = Backoff()
        self._replayer: threading.Thread | None = None
        self._closed = threading.Event()

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
        self._count("enqueued")
        return result

    # --- spool and lifecycle
    @property
    def stats(self) -> ProducerStats:
        with self._lock:
            return ProducerStats(**self._counts)

    @property
    def spool_size(self) -> int:
        return len(self._spool)

    def drain_spool(self) -> int:
        """Replay the spool now, in the caller's thread, ignoring the back-off; stops at the first
        failure. Returns how many contexts were replayed."""
        replayed = 0
        while len(self._spool):
            try:
                replayed += self._replay_batch()
            except RedisUnavailable as exc:
                self._record_failure(exc)
                break
            except Exception:  # close() must not raise; this is not Redis failing
                log.exception("memq: unexpected error replaying the spool")
                break
        return replayed

    def hand_over(self, timeout_seconds: float) -> bool:
        """Send the spool to Redis within ``timeout_seconds`` (a hard bound, for shutdown hooks).

        True only when nothing is left spooled and no replay is still sending; False when Redis
        did not take everything in time (what is left stays spooled). Once in Redis a context
        is durable, so nothing else needs draining before the process exits.
        """
        deadline = time.monotonic() + max(0.0, timeout_seconds)
        done = threading.Event()

        def drain() -> None:
            try:
                self.drain_spool()
            finally:
                done.set()

        threading.Thread(target=drain, name="memq-hand-over", daemon=True).start()
        if not done.wait(max(0.0, deadline - time.monotonic())):
            return False
        while True:
            with self._lock:
                replaying = self._replayer is not None and self._replayer.is_alive()
            if not len(self._spool) and not replaying:
                return True
            if len(self._spool) and not replaying:
                return False  # the drain stopped at a failure: Redis is not taking it
            # The background replay holds a batch it took before the drain: let it finish.
            if self._closed.wait(min(0.01, max(0.0, deadline - time.monotonic()))):
                return not len(self._spool)
            if time.monotonic() >= deadline:
                return False

    def close(self) -> None:
        """Stop the replay thread, try one last drain (bounded by the socket timeouts), and close
        the client if the producer built it. Whatever is still spooled then is lost."""
        self._closed.set()
        replayer = self._replayer
        if replayer is not None:
            replayer.join(_CLOSE_JOIN_SECONDS)
        self.drain_spool()
        if len(self._spool):
            log.warning(
                "memq: closing with %d contexts still spooled; they are lost", len(self._spool)
            )
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
        key = ContextKey.create(thread_id, user_id, agent_name)
        return build_request(
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
        if self._backoff.skipping():
            self._keep_for_later(request)  # Redis failed just now: do not pay the timeout again
            return False
        older = self._spool.take(request.context_id)
        if older is not None:
            request = older.merged_under(request)
        try:
            self._enqueue(request, self._clock_ms())
        except RedisUnavailable as exc:
            self._record_failure(exc)
            self._keep_for_later(request)
            return False
        except Exception as exc:
            # Not the agent's problem, and not Redis failing: the replay tries it a few more times.
            self._failed_unexpectedly(request, exc)
            return False
        self._count("enqueued")
        self._record_recovery()
        if len(self._spool):
            self._ensure_replayer()
        return True

    def _count(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._counts[name] += amount

    def _keep_for_later(self, request: EnqueueRequest) -> None:
        dropped = self._spool.put(request)
        self._count("spooled")
        if dropped:
            self._count("dropped", dropped)
            log.warning(
                "memq: spool full (%d contexts); dropped %d",
                self._settings.spool_max_contexts,
                dropped,
            )
        if len(self._spool):
            self._ensure_replayer()

    def _failed_unexpectedly(self, request: EnqueueRequest, exc: Exception) -> None:
        """A send failed for a reason other than Redis: back of the spool for another try, or
        dropped once it has failed too often. Logged by type only: the message of an arbitrary
        error may quote the conversation."""
        self._count("errors")
        failures = request.failures + 1
        if failures >= _MAX_UNEXPECTED_FAILURES:
            self._count("poisoned")
            log.warning(
                "memq: dropped %s after %d failed tries (%s, not a Redis error)",
                request.key.describe(),
                failures,
                type(exc).__name__,
            )
            return
        self._keep_for_later(replace(request, failures=failures))

    def _record_failure(self, exc: BaseException) -> None:
        if self._backoff.failed():
            log.warning("memq: Redis unavailable, spooling conversations locally: %s", exc)

    def _record_recovery(self) -> None:
        if self._backoff.recovered():
            log.warning(
                "memq: Redis reachable again; replaying %d spooled contexts", len(self._spool)
            )

    def _replay_batch(self) -> int:
        batch = self._spool.pop_batch(_REPLAY_BATCH)
        sent = 0
        for index, request in enumerate(batch):
            try:
                self._enqueue(request, self._clock_ms())
            except RedisUnavailable:
                # Back in oldest-first order, merged with any copy spooled meanwhile (the one
                # captured later keeps its messages).
                for rest in reversed(batch[index:]):
                    if self._spool.put_back(rest):
                        self._count("dropped")
                raise
            except Exception as exc:
                # At the back (or dropped), so a request that keeps failing cannot hold up the
                # others; the rest of the batch goes on.
                self._failed_unexpectedly(request, exc)
                continue
            sent += 1
            self._count("replayed")
            self._record_recovery()
        return sent

    def _ensure_replayer(self) -> None:
        with self._lock:
            if self._replayer is not None or self._closed.is_set():
                return
            self._replayer = threading.Thread(
                target=self._replay_loop, name="memq-spool-replay", daemon=True
            )
            self._replayer.start()

    def _replay_loop(self) -> None:
        while not self._closed.is_set():
            wait = self._backoff.wait_seconds()
            if wait > 0 and self._closed.wait(wait):
                break
            try:
                self._replay_batch()
            except RedisUnavailable as exc:
                self._record_failure(exc)
            except Exception:  # a daemon thread that dies silently would strand the spool
                log.exception("memq: unexpected error replaying the spool")
                # Not Redis failing, so no back-off for the agents; a pause keeps this from
                # spinning if it repeats.
                if self._closed.wait(_UNEXPECTED_PAUSE_SECONDS):
                    break
            with self._lock:
                if not len(self._spool) or self._closed.is_set():
                    self._replayer = None
                    return
        with self._lock:
            self._replayer = None
