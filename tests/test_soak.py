"""The short chaos soak: about two minutes of steady load on the real stack (AOF Redis, a prefork
and a threads worker, two beats, the scripted model with latency and ~10 % faults, agent replicas)
under the long soak's faults — workers killed and paused past their lease, Redis restarted and
killed -9, a beat killed, users forgotten — then the oracle: nothing lost, nothing duplicated,
every document valid, nothing left of a forgotten user. ``make soak`` runs the long one.

Redis runs with ``appendfsync always`` here: no acknowledged turn may be lost, even to kill -9.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from bench.soak.harness import SoakConfig, run_soak
from bench.soak.report import render

pytestmark = [pytest.mark.reliability, pytest.mark.slow]


@pytest.mark.timeout(900)
def test_short_soak_holds_the_invariants_under_faults(tmp_path: Path) -> None:
    lines: list[str] = []
    config = SoakConfig(
        minutes=2.0,
        rate=12.0,
        threads=120,
        users=30,
        agents=3,
        producers=2,
        appendfsync="always",
        prefork_concurrency=2,
        thread_concurrency=4,
        forget_users=2,
        drain_timeout_seconds=240.0,
        work_dir=tmp_path / "soak",
        log=lines.append,
    )
    result = run_soak(config)
    report = "\n".join(lines + render(result))
    assert result.drained, report
    assert result.verdict.produced > 0 and result.verdict.extracted > 0, report
    assert result.verdict.failures == [], report
    assert result.faults_not_performed == [], report
    assert result.passed, report
