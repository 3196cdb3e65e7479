"""Machine-readable outputs are contracts: each carries a schema ``version`` and keeps the shape
pinned here. A change that renames, moves or removes a field raises the version and says so in
CHANGELOG.md; a test here then fails until it is updated on purpose.

Pinned: `memq stats --json` and `/v1/queue/stats` (one shape, :func:`memq.core.metrics.summarise`),
`memq doctor --json`, and `memq eval`'s results.json (:func:`memq.evaluation.report.build_result`).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import httpx
import pytest
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from memq.commands.doctor import DOCTOR_VERSION
from memq.core.metrics import BATCH_DEPTHS, COUNTERS, STATS_VERSION
from memq.core.settings import MemqSettings
from memq.evaluation.locomo import read_locomo
from memq.evaluation.report import RESULT_VERSION, Models, PriceTable, build_result
from memq.evaluation.scoring import Prices
from memq.server.exporter import build_registry
from tests.support.cli import Run
from tests.support.serve import Keys, bearer

CHANGELOG = Path(__file__).resolve().parent.parent / "CHANGELOG.md"
LOCOMO = Path(__file__).parent / "data" / "eval" / "locomo_small.json"

# Every counter of COUNTERS is a top-level field too (adding a counter adds a field).
STATS_FIELDS = {
    "version", "due", "inflight", "dead", "batch_pending", "batch_out", "batch_jobs",
    "oldest_due_lag_ms", "last_tick_age_ms", "shards", "extractions", "completed_total",
    "dead_lettered_total", "llm_requests", "deferred", "llm_latency_mean_seconds",
    "cached_share", "llm_cost_usd", "cost_per_extraction_usd", "cost_per_1000_turns_usd",
} | {c.field for c in COUNTERS}  # fmt: skip
SHARD_FIELDS = {
    "shard", "due", "inflight", "dead", "batch_pending", "batch_out", "batch_jobs",
    "oldest_due_lag_ms",
}  # fmt: skip
CHECK_FIELDS = {"status", "name", "detail", "fix"}
RESULT_FIELDS = {
    "version", "benchmark", "models", "judge", "conversations", "turns", "questions", "graded",
    "accuracy", "tokens_per_question", "extraction", "answer", "judge_usage", "prices",
    "latency_ms", "extraction_quality", "estimate", "per_question",
}  # fmt: skip
EXTRACTION_FIELDS = {
    "calls", "prompt_tokens", "cached_tokens", "completion_tokens", "batch_prompt_tokens",
    "batch_cached_tokens", "batch_completion_tokens", "turns_extracted", "cost_usd",
    "cost_per_1000_turns_usd", "calls_per_1000_turns", "outcomes",
}  # fmt: skip


@pytest.fixture
def cli(cli_env: MemqSettings, run: Run) -> Any:
    """`memq <argv>` as an operator's shell runs it, on the test's Redis; its stdout as JSON."""

    def as_json(*argv: str) -> Any:
        code, out, _ = run(*argv)
        assert code in (0, 1), code  # doctor answers 1 when a check fails
        return json.loads(out)

    return as_json


def test_every_version_is_named_in_the_changelog() -> None:
    text = CHANGELOG.read_text(encoding="utf-8")
    assert "## Unreleased" in text
    for name, version in (
        ("memq stats --json", STATS_VERSION),
        ("memq doctor --json", DOCTOR_VERSION),
        ("results.json", RESULT_VERSION),
    ):
        assert f"{name}` version {version}" in text, name


@pytest.mark.integration
def test_stats_json_and_the_http_queue_stats_have_one_pinned_shape(
    cli: Any, settings: MemqSettings, serve_for: Any, api_keys: tuple[Keys, Any]
) -> None:
    stats = cli("stats", "--json")
    assert stats["version"] == STATS_VERSION == 1
    assert set(stats) == STATS_FIELDS
    assert [set(s) for s in stats["shards"]] == [SHARD_FIELDS]
    keys, _ = api_keys
    server = serve_for(settings)
    with httpx.Client(base_url=server.url, timeout=10) as http:
        served = http.get("/v1/queue/stats", headers=bearer(keys.admin)).json()
    assert served["version"] == STATS_VERSION
    assert set(served) == STATS_FIELDS and served["shards"][0].keys() == SHARD_FIELDS


@pytest.mark.integration
def test_the_exporter_serves_the_batch_depths_by_their_one_name(
    settings: MemqSettings, redis_client: Any
) -> None:
    text = generate_latest(build_registry(settings, redis_client)).decode()
    served = {f.name for f in text_string_to_metric_families(text)}
    assert {f"memq_{d.name}" for d in BATCH_DEPTHS} <= served
    assert {d.name for d in BATCH_DEPTHS} <= STATS_FIELDS


@pytest.mark.integration
def test_doctor_json_is_a_versioned_object_of_checks(cli: Any) -> None:
    report = cli("doctor", "--json")
    assert set(report) == {"version", "checks"} and report["version"] == DOCTOR_VERSION == 1
    assert report["checks"] and all(set(c) == CHECK_FIELDS for c in report["checks"])


def test_the_eval_result_has_its_pinned_shape() -> None:
    evalset = read_locomo(json.loads(LOCOMO.read_text(encoding="utf-8"))).select(limit=1)
    prices = Prices(1.0, 2.0)
    result = build_result(
        evalset, {}, {}, {}, {"billed_runs": 1, "turns_extracted": 2, "cost_nano_usd": 5},
        Models("a", "b", "c"), PriceTable(prices, prices, prices, "settings"), {},
    )  # fmt: skip
    assert result["version"] == RESULT_VERSION == 1
    assert set(result) == RESULT_FIELDS
    assert set(result["extraction"]) == EXTRACTION_FIELDS
