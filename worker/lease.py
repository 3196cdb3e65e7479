"""Keeping a claim alive while its run is in progress.

One lease covers an ordinary extraction many times over, but a model call with retries and
Retry-After waits can outlast it; the reaper would then hand the context to a second worker while
the first is still running (invariant 3: one at a time). So a run renews its lease every third of
it — yet only for a bounded time, so that a run stuck for good still loses its claim and the
context is extracted elsewhere (the stuck run's completion is then stale, a no-op).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import TracebackType

import redis

from worker.queue import QueueClient

log = logging.getLogger("memq.extract")

RENEWALS_PER_LEASE = 3
MAX_LEASES_PER_RUN = 10


class LeaseKeeper:
    """``with LeaseKeeper(...):`` renews the claim in a daemon thread until the block ends."""

    def __init__(
        self,
        queue: QueueClient,
        context_id: str,
        token: str,
        *,
        lease_seconds: float,
        clock: Callable[[], int],
    ) -> None:
        self._queue, self._context_id, self._token, self._clock = queue, context_id, token, clock
        self._interval = lease_seconds / RENEWALS_PER_LEASE
        self._renewals_left = RENEWALS_PER_LEASE * MAX_LEASES_PER_RUN
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memq-lease", daemon=True)
        self.renewals = 0

    def __enter__(self) -> LeaseKeeper:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self._stop.set()
        self._thread.join(timeout=5.0)

    def _run(self) -> None:
        while not self._stop.wait(self._interval):
            if self._renewals_left <= 0:
                log.warning(
                    "extraction key=%s still running after %d leases; letting the claim expire",
                    self._context_id,
                    MAX_LEASES_PER_RUN,
                )
                return
            self._renewals_left -= 1
            try:
                if not self._queue.renew(self._context_id, self._token, self._clock()):
                    return  # the claim is gone (reaped, purged): nothing left to keep
            except redis.RedisError as exc:  # Redis may come back before the lease runs out
                log.warning("lease renewal of key=%s failed: %s", self._context_id, exc)
                continue
            self.renewals += 1
