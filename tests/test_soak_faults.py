"""The soak's fault schedule: every kind of fault, a worker killed every minute, and the Redis
faults kept apart from the forgets (so an erasure is never judged across a Redis outage)."""

from __future__ import annotations

from collections import Counter

import pytest

from bench.soak.faults import schedule


@pytest.mark.parametrize(("minutes", "kills"), [(2, 3), (10, 10), (30, 30)])
def test_every_fault_kind_and_a_worker_kill_every_minute(minutes: int, kills: int) -> None:
    faults = schedule(minutes * 60, lease_seconds=6.0)
    kinds = Counter(f.kind for f in faults)
    assert kinds == {
        "worker_kill": kills,
        "worker_pause": 1,
        "redis_restart": 1,
        "redis_kill": 1,
        "beat_kill": 1,
        "forget": 2,
    }
    assert [f.at_seconds for f in faults] == sorted(f.at_seconds for f in faults)
    assert all(0 < f.at_seconds < minutes * 60 for f in faults)
    (pause,) = [f for f in faults if f.kind == "worker_pause"]
    assert pause.hold_seconds > 6.0  # past the lease
    redis_at = [f.at_seconds for f in faults if f.kind.startswith("redis")]
    for forget in (f for f in faults if f.kind == "forget"):
        assert all(abs(forget.at_seconds - at) >= minutes * 60 * 0.1 for at in redis_at)
