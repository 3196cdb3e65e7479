"""The soak's fault schedule: what happens when, as plain data, and how long each took to recover.

``schedule`` is a pure function of the run's length and lease; the harness performs each fault and
measures its recovery:
- a worker killed (-9) or paused past its lease: until every context that was in flight at the
  fault has settled or been claimed again (its old claim is gone);
- Redis restarted or killed: until Redis answers and an extraction completes again;
- a beat killed: until it is back and an extraction completes;
- users forgotten: until the erasure returned.
"""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass(frozen=True)
class Fault:
    at_seconds: float
    kind: str  # worker_kill | worker_pause | redis_restart | redis_kill | beat_kill | forget
    hold_seconds: float = 0.0  # how long a pause lasts


@dataclass
class FaultRecord:
    fault: Fault
    started_ms: int
    detail: str = ""
    recovered_ms: int | None = None
    notes: list[str] = field(default_factory=list)

    @property
    def recovery_seconds(self) -> float | None:
        if self.recovered_ms is None:
            return None
        return (self.recovered_ms - self.started_ms) / 1000


def schedule(duration_seconds: float, lease_seconds: float) -> list[Fault]:
    """A worker killed every minute (every third of the run when shorter, at least twice), one
    worker paused past its lease, one graceful Redis restart and one kill -9, a beat killed, and
    users forgotten twice; the Redis faults and the forgets are kept apart."""
    d = duration_seconds
    kill_every = min(60.0, d / 3)
    faults = []
    at = kill_every * 0.5
    while at < d:
        faults.append(Fault(at, "worker_kill"))
        at += kill_every
    faults += [
        Fault(d * 0.20, "worker_pause", hold_seconds=lease_seconds * 1.5),
        Fault(d * 0.30, "forget"),
        Fault(d * 0.40, "redis_restart"),
        Fault(d * 0.55, "beat_kill"),
        Fault(d * 0.70, "redis_kill"),
        Fault(d * 0.85, "forget"),
    ]
    return sorted(faults, key=lambda f: f.at_seconds)
