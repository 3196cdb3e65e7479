"""Wait on a condition with a deadline instead of sleeping for a guessed time.

``DEADLINE_SECONDS`` is the one deadline of every wait in the tests, the benchmarks and the soak
for a process to start or a state to change. It is sized for a loaded 2-core machine (a Celery
worker has taken more than 30 s there to say "ready", a Redis Cluster failover more than 30 s to
switch): a wait returns as soon as its condition holds, so a long deadline costs time only when
something is already broken, while a short one fails healthy runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

T = TypeVar("T")

DEADLINE_SECONDS = 120.0


def wait_for(
    condition: Callable[[], T],
    *,
    timeout: float = DEADLINE_SECONDS,
    interval: float = 0.02,
    what: str = "",
) -> T:
    """Re-check ``condition`` every ``interval`` until it returns something true (returned), or
    raise once ``timeout`` has passed. The condition is checked once more at the deadline, so a
    state reached during the last sleep is never reported as a timeout."""
    deadline = time.monotonic() + timeout
    while True:
        past_deadline = time.monotonic() > deadline
        result = condition()
        if result:
            return result
        if past_deadline:
            raise AssertionError(f"timed out after {timeout:g}s waiting for {what or condition}")
        time.sleep(interval)  # wait-ok: polling interval of a condition with a deadline
