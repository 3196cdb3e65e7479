"""Keeping a claim alive while its run is in progress.

One lease covers an ordinary extraction many times over, but a model call with retries and
Retry-After waits can outlast it; the reaper would then hand the context to a second worker while
the first is still running (one extraction per context at a time). So a run renews its lease every
third of it until its time budget is spent (the Celery hard time limit, derived from the LLM
timeout and retries): under the prefork pool the run is stopped by then, so its claim can only be
taken over after it ended. A run that outlives its budget anyway (a threads pool cannot stop it,
a paused process does not know) loses its claim, and the fenced save discards its answer.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from types import TracebackType

from memq.core.connection import REDIS_ERRORS
from worker.queue import QueueClient

log = logging.getLogger("memq.extract")

RENEWALS_PER_LEASE = 3


class LeaseKeeper:
    """``with LeaseKeeper(...):`` renews the claim in a daemon thread until the block ends."""

    def __init__(
        self,
        queue: QueueClient,
        context_id: str,
        token: str,
        *,
        lease_seconds: float,
        renew_until_ms: int,
        clock: Callable[[], int],
    ) -> None:
        self._queue, self._context_id, self._token, self._clock = queue, context_id, token, clock
        self._interval = lease_seconds / RENEWALS_PER_LEASE
        self._renew_until_ms = renew_until_ms
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="memq-lease", daemon=True)

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
            if self._clock() >= self._renew_until_ms:
                log.warning(
                    "extraction key=%s still running past its time budget; letting the claim "
                    "expire (its save will be refused)",
                    self._context_id,
                )
                return
            try:
                if not self._queue.renew(self._context_id, self._token, self._clock()):
                    return  # the claim is gone (reaped, purged): nothing left to keep
            except REDIS_ERRORS as exc:  # Redis may come back before the lease runs out
                log.warning("lease renewal of key=%s failed: %s", self._context_id, exc)
                continue
