"""The producer's spool replay: what is kept for later, and the daemon thread that sends it.

A request goes to the spool when Redis did not answer (and the shared back-off starts), or when it
failed for another reason, at the back and with its failure counted, so one request that cannot be
sent never holds up the others; after a few such tries it is dropped (``poisoned``). The replay
thread starts when something is spooled, waits out the back-off, sends the spool oldest first in
batches, and ends once the spool is empty.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import replace

from memq.core.errors import RedisUnavailable
from producer.backoff import Backoff
from producer.enqueue import EnqueueRequest
from producer.spool import Spool

# The producer's logger: operators filter on it, and the replay is part of the producer.
log = logging.getLogger("producer.producer")

REPLAY_BATCH = 100
# Tries of a request that fails for a reason other than Redis before it is dropped.
MAX_UNEXPECTED_FAILURES = 3
CLOSE_JOIN_SECONDS = 2.0
UNEXPECTED_PAUSE_SECONDS = 0.5


class SpoolReplay:
    """Keeps requests in ``spool`` and replays them through ``send`` in a daemon thread.

    ``count(name, amount)`` adds to the producer's counters (``spooled``, ``replayed``,
    ``dropped``, ``errors``, ``poisoned``); ``backoff`` is the producer's, so a replay that finds
    Redis away holds the agents' calls off too, and one that gets through ends the back-off.
    """

    def __init__(
        self,
        spool: Spool,
        send: Callable[[EnqueueRequest], object],
        backoff: Backoff,
        count: Callable[[str, int], None],
        *,
        spool_max_contexts: int,
    ) -> None:
        self._spool = spool
        self._send = send
        self._backoff = backoff
        self._count = count
        self._spool_max_contexts = spool_max_contexts
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._closed = threading.Event()

    def keep_for_later(self, request: EnqueueRequest) -> None:
        dropped = self._spool.put(request)
        self._count("spooled", 1)
        if dropped:
            self._count("dropped", dropped)
            log.warning(
                "memq: spool full (%d contexts); dropped %d", self._spool_max_contexts, dropped
            )
        if len(self._spool):
            self.ensure_running()

    def failed_unexpectedly(self, request: EnqueueRequest, exc: Exception) -> None:
        """A send failed for a reason other than Redis: back of the spool for another try, or
        dropped once it has failed too often. Logged by type only: the message of an arbitrary
        error may quote the conversation."""
        self._count("errors", 1)
        failures = request.failures + 1
        if failures >= MAX_UNEXPECTED_FAILURES:
            self._count("poisoned", 1)
            log.warning(
                "memq: dropped %s after %d failed tries (%s, not a Redis error)",
                request.key.describe(),
                failures,
                type(exc).__name__,
            )
            return
        self.keep_for_later(replace(request, failures=failures))

    def record_failure(self, exc: BaseException) -> None:
        if self._backoff.failed():
            log.warning("memq: Redis unavailable, spooling conversations locally: %s", exc)

    def record_recovery(self) -> None:
        if self._backoff.recovered():
            log.warning(
                "memq: Redis reachable again; replaying %d spooled contexts", len(self._spool)
            )

    def drain(self) -> int:
        """Replay the spool now, in the caller's thread, ignoring the back-off; stops at the first
        failure. Returns how many contexts were replayed."""
        replayed = 0
        while len(self._spool):
            try:
                replayed += self._replay_batch()
            except RedisUnavailable as exc:
                self.record_failure(exc)
                break
            except Exception:  # close() must not raise; this is not Redis failing
                log.exception("memq: unexpected error replaying the spool")
                break
        return replayed

    def hand_over(self, timeout_seconds: float) -> bool:
        """Drain within ``timeout_seconds`` (a hard bound); True only when nothing is left
        spooled and no replay is still sending."""
        deadline = time.monotonic() + max(0.0, timeout_seconds)
        done = threading.Event()

        def drain() -> None:
            try:
                self.drain()
            finally:
                done.set()

        threading.Thread(target=drain, name="memq-hand-over", daemon=True).start()
        if not done.wait(max(0.0, deadline - time.monotonic())):
            return False
        while True:
            with self._lock:
                replaying = self._thread is not None and self._thread.is_alive()
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
        """Stop the replay thread (waiting a bounded time for its batch); no new one starts."""
        self._closed.set()
        thread = self._thread
        if thread is not None:
            thread.join(CLOSE_JOIN_SECONDS)

    def ensure_running(self) -> None:
        with self._lock:
            if self._thread is not None or self._closed.is_set():
                return
            self._thread = threading.Thread(
                target=self._loop, name="memq-spool-replay", daemon=True
            )
            self._thread.start()

    def _replay_batch(self) -> int:
        batch = self._spool.pop_batch(REPLAY_BATCH)
        sent = 0
        for index, request in enumerate(batch):
            try:
                self._send(request)
            except RedisUnavailable:
                # Back in oldest-first order, merged with any copy spooled meanwhile (the one
                # captured later keeps its messages).
                for rest in reversed(batch[index:]):
                    if self._spool.put_back(rest):
                        self._count("dropped", 1)
                raise
            except Exception as exc:
                # At the back (or dropped), so a request that keeps failing cannot hold up the
                # others; the rest of the batch goes on.
                self.failed_unexpectedly(request, exc)
                continue
            sent += 1
            self._count("replayed", 1)
            self.record_recovery()
        return sent

    def _loop(self) -> None:
        while not self._closed.is_set():
            wait = self._backoff.wait_seconds()
            if wait > 0 and self._closed.wait(wait):
                break
            try:
                self._replay_batch()
            except RedisUnavailable as exc:
                self.record_failure(exc)
            except Exception:  # a daemon thread that dies silently would strand the spool
                log.exception("memq: unexpected error replaying the spool")
                # Not Redis failing, so no back-off for the agents; a pause keeps this from
                # spinning if it repeats.
                if self._closed.wait(UNEXPECTED_PAUSE_SECONDS):
                    break
            with self._lock:
                if not len(self._spool) or self._closed.is_set():
                    self._thread = None
                    return
        with self._lock:
            self._thread = None
