"""One answer to "is beat alive?": `/readyz` (a real `memq serve`), `memq doctor`'s ticker check
and the MemqBeatDown alert agree on the threshold, memq.core.metrics.beat_alive_within_ms."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis
import yaml

from memq.commands.doctor import check_ticker
from memq.core.clock import now_ms
from memq.core.metrics import (
    BEAT_ALIVE_SECONDS,
    MetricsRecorder,
    beat_alive,
    beat_alive_within_ms,
)
from memq.core.settings import MemqSettings
from worker.tick import TickReport

ALERTS = Path(__file__).resolve().parent.parent / "deploy/prometheus/alerts.yml"


def test_the_threshold_is_thirty_seconds_and_never_fewer_than_ten_ticks() -> None:
    assert beat_alive_within_ms(1.0) == 30_000
    assert beat_alive_within_ms(6.0) == 60_000
    assert beat_alive(1_000, 31_000, 1.0) and not beat_alive(1_000, 31_001, 1.0)
    assert not beat_alive(None, 1_000, 1.0)  # never ticked


def test_the_alert_fires_past_the_same_threshold() -> None:
    rules = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))["groups"][0]["rules"]
    (rule,) = [r for r in rules if r["alert"] == "MemqBeatDown"]
    found = re.fullmatch(
        r"time\(\) - max\(memq_last_tick_timestamp_seconds\) > (\d+(?:\.\d+)?)", rule["expr"]
    )
    assert found is not None, rule["expr"]
    assert float(found.group(1)) == BEAT_ALIVE_SECONDS


@pytest.mark.integration
def test_readyz_and_doctor_agree_on_either_side_of_the_threshold(
    settings: MemqSettings, redis_client: redis.Redis, serve_for: Any
) -> None:
    recorder = MetricsRecorder.for_settings(settings, redis_client)
    limit = beat_alive_within_ms(settings.tick_seconds)
    server = serve_for(settings)
    with httpx.Client(base_url=server.url, timeout=10) as http:
        for age_ms, alive in ((limit - 5_000, True), (limit + 5_000, False)):
            recorder.tick(TickReport(), now_ms() - age_ms)
            ready = http.get("/readyz")
            (check,) = check_ticker(redis_client, settings)
            assert (ready.status_code == 200) is alive, ready.text
            assert (check.status == "ok") is alive, check
