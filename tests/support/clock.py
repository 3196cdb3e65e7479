"""Clocks a test controls, passed where a part takes a ``clock`` callable (the budget, the rate
limit, the batch lane, the scripted provider's cache). One module, so a test never grows its own.

``Clock(now)`` returns ``now`` until the test sets or moves it (``clock.now += 500``), in the unit
of the part it is given to: epoch milliseconds (an ``int``) for memq's own parts, seconds (a
``float``) for the scripted provider. ``ShiftedClock`` is the real time in epoch milliseconds,
moved ahead by the test, for parts that also meet real processes (Redis TTLs, a worker).
"""

from __future__ import annotations

from typing import Generic, TypeVar

from worker.queue import now_ms

N = TypeVar("N", int, float)

T0_MS = 1_700_000_000_000  # an epoch-ms start for tests that need no particular date


class Clock(Generic[N]):
    def __init__(self, now: N) -> None:
        self.now = now

    def __call__(self) -> N:
        return self.now


class ShiftedClock:
    """Real time, moved ahead by the test (e.g. the batch lane polls a job once its time came)."""

    def __init__(self) -> None:
        self.offset_ms = 0

    def __call__(self) -> int:
        return now_ms() + self.offset_ms

    def advance(self, seconds: float) -> None:
        self.offset_ms += int(seconds * 1000)
