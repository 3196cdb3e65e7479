"""One tick of the ticker: reap expired leases, then claim due contexts in batches and dispatch one
extraction per claim, until nothing is due, ``inflight`` is full, or the tick's time is up.

Celery-free: ``dispatch`` is any callable that sends one claim somewhere (the Celery task in
production, a list in tests), so the loop is tested against a real Redis without a worker.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass

from memq.core.clock import now_ms
from memq.core.metrics import MetricsRecorder
from worker.batch_queue import BatchQueue
from worker.queue import Claim, QueueClient

log = logging.getLogger("memq.tick")

Dispatch = Callable[[Claim], None]


@dataclass(frozen=True, slots=True)
class TickReport:
    claimed: int = 0
    dispatched: int = 0
    released: int = 0
    requeued: int = 0  # expired leases put back in `due`
    dead: int = 0  # expired leases past max_attempts
    full: bool = False  # stopped by backpressure
    rounds: int = 0
    deferred: int = 0  # due contexts moved back because their user was at its in-flight cap


def max_rounds_for(max_inflight: int, claim_batch: int) -> int:
    """Enough claim rounds to fill ``inflight`` once, plus slack for rounds spent on orphans."""
    return 2 * max(1, math.ceil(max_inflight / claim_batch)) + 1


def run_tick(
    queue: QueueClient,
    dispatch: Dispatch,
    *,
    clock: Callable[[], int] = now_ms,
    max_rounds: int | None = None,
    budget_ms: int | None = None,
) -> TickReport:
    """Reap, then claim and dispatch in batches of ``claim_batch``.

    A claim whose dispatch fails is released at once (no attempt counted), and so is the rest of
    its batch: a broker that refuses one send will refuse the next, and each refusal costs a retry
    policy's worth of waiting. Without the release the lease reaper would still bring them back.

    A round that only met users at their in-flight cap claims nothing but moves those keys past
    this tick, so the next round reaches keys further down ``due``. Such rounds do not use up
    ``max_rounds`` (else a wall of one tenant's backlog would end the tick before another tenant's
    key): the time budget bounds them, and so does ``due`` itself, since every such round takes
    its keys out of this tick's range.
    """
    settings = queue.settings
    rounds_left = max_rounds or max_rounds_for(settings.max_inflight, settings.claim_batch)
    budget = budget_ms if budget_ms is not None else int(settings.tick_seconds * 1000)
    started = time.monotonic()
    reaped = queue.reap(clock())
    claimed = dispatched = released = rounds = deferred = 0
    full = False
    while rounds_left > 0:
        rounds += 1
        batch = queue.claim(clock())
        claimed += len(batch.claims)
        deferred += batch.deferred
        if batch.claims or not batch.deferred:
            rounds_left -= 1
        sent, failed = _dispatch_all(queue, dispatch, batch.claims, clock)
        dispatched += sent
        released += failed
        full = batch.full
        if failed or batch.full or batch.examined == 0:
            break
        if (time.monotonic() - started) * 1000 >= budget:
            break
    report = TickReport(
        claimed=claimed,
        dispatched=dispatched,
        released=released,
        requeued=reaped.requeued,
        dead=reaped.dead,
        full=full,
        rounds=rounds,
        deferred=deferred,
    )
    # The heartbeat: "time of the last tick" is what tells an operator beat is alive.
    MetricsRecorder(queue.redis, queue.keys.metrics()).tick(report, clock())
    return report


def _dispatch_all(
    queue: QueueClient, dispatch: Dispatch, claims: list[Claim], clock: Callable[[], int]
) -> tuple[int, int]:
    """Send every claim; after the first failure, release the failed one and all the rest."""
    for index, claim in enumerate(claims):
        try:
            dispatch(claim)
        except Exception as exc:
            log.warning(
                "dispatch failed key=%s error=%s; releasing %d claim(s)",
                claim.context_id,
                type(exc).__name__,
                len(claims) - index,
            )
            for pending in claims[index:]:
                _release(queue, pending, clock())
            return index, len(claims) - index
    return len(claims), 0


def _release(queue: QueueClient, claim: Claim, now: int) -> None:
    try:
        queue.release(claim.context_id, claim.token, now)
    except Exception as exc:  # the lease reaper brings it back later
        log.warning("release failed key=%s error=%s", claim.context_id, type(exc).__name__)


def dispatch_batch_work(batches: BatchQueue, dispatch: Callable[[], None], now: int) -> bool:
    """Send the batch lane's task when some shard has parked runs, a job whose poll is due, or a
    context out past its job's window; one pipelined read otherwise. The task itself gathers and
    polls (HTTP to the provider), so the tick never waits on it."""
    try:
        if not batches.has_work(now):
            return False
        dispatch()
    except Exception as exc:  # the next tick tries again
        log.warning("batch task not sent: %s", type(exc).__name__)
        return False
    return True
