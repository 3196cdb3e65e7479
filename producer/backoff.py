"""Skip-until back-off for the agent-facing Redis calls (the producer's writes, the injector's
reads).

After Redis fails to answer, the next calls do not try it again until a deadline that doubles with
each failure (0.5 s up to 5 s): a Redis that accepts connections and never answers costs an agent
one timeout per back-off, not one per turn. Only Redis being unavailable counts as a failure; a
request that fails for its own reasons (it cannot be encoded, say) says nothing about Redis.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable

BACKOFF_MIN_SECONDS = 0.5
BACKOFF_MAX_SECONDS = 5.0


class Backoff:
    """Thread-safe. :meth:`failed` and :meth:`recovered` say whether they started or ended an
    outage, so the caller logs one line for each, not one per call."""

    def __init__(
        self,
        *,
        min_seconds: float | None = None,
        max_seconds: float | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._min = BACKOFF_MIN_SECONDS if min_seconds is None else min_seconds
        self._max = BACKOFF_MAX_SECONDS if max_seconds is None else max_seconds
        self._clock = clock
        self._lock = threading.Lock()
        self._seconds = 0.0
        self._skip_until = 0.0  # clock() before which Redis is not tried
        self._outage = False

    @property
    def in_outage(self) -> bool:
        """Redis failed and has not answered since."""
        return self._outage

    def skipping(self) -> bool:
        """Whether calls should not try Redis now (it failed a moment ago)."""
        return bool(self._skip_until) and self._clock() < self._skip_until

    def wait_seconds(self) -> float:
        """How long until Redis may be tried again (0 when it may be tried now)."""
        return max(0.0, self._skip_until - self._clock()) if self._skip_until else 0.0

    def failed(self) -> bool:
        """Redis did not answer: skip it for the next, longer, back-off. True when this failure
        starts an outage."""
        with self._lock:
            self._seconds = min(self._max, max(self._min, self._seconds * 2))
            self._skip_until = self._clock() + self._seconds
            first = not self._outage
            self._outage = True
        return first

    def recovered(self) -> bool:
        """Redis answered. True when this ends an outage."""
        if not self._outage:  # the common case, without the lock
            return False
        with self._lock:
            was_out = self._outage
            self._outage = False
            self._seconds = 0.0
            self._skip_until = 0.0
        return was_out
