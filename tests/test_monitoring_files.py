"""deploy/: the Grafana dashboard loads (its structure is what Grafana's provisioning reads) and
every metric it or an alert rule queries is one the exporter serves."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import redis
import yaml
from prometheus_client.exposition import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from memq.core.settings import MemqSettings
from memq.server.exporter import build_registry

ROOT = Path(__file__).resolve().parent.parent
DASHBOARD = ROOT / "deploy/grafana/memq-dashboard.json"
ALERTS = ROOT / "deploy/prometheus/alerts.yml"
DATASOURCES = ROOT / "deploy/grafana/provisioning/datasources/prometheus.yml"
METRIC = re.compile(r"\b(memq_[a-z0-9_]+)")
PANEL_TYPES = {"stat", "timeseries", "gauge", "table", "bargauge", "text"}
ALERTS_REQUIRED = {"MemqBeatDown", "MemqLagHigh", "MemqDeadLettersGrowing", "MemqLLMErrorRate"}


@pytest.fixture
def served_names(settings: MemqSettings, redis_client: redis.Redis) -> set[str]:
    """Every sample name `/metrics` serves (on an empty deployment: families are always there)."""
    text = generate_latest(build_registry(settings, redis_client)).decode()
    return {s.name for f in text_string_to_metric_families(text) for s in f.samples}


def dashboard() -> dict[str, Any]:
    data = json.loads(DASHBOARD.read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def queried(expressions: list[str]) -> set[str]:
    return {name for expr in expressions for name in METRIC.findall(expr)}


def test_dashboard_structure() -> None:
    data = dashboard()
    assert data["uid"] and data["title"] and isinstance(data["schemaVersion"], int)
    panels = data["panels"]
    assert panels and len({p["id"] for p in panels}) == len(panels)
    datasource_uids = {d["uid"] for d in yaml.safe_load(DATASOURCES.read_text())["datasources"]}
    cells: set[tuple[int, int]] = set()
    for panel in panels:
        assert panel["type"] in PANEL_TYPES and panel["title"]
        grid = panel["gridPos"]
        assert all(isinstance(grid[k], int) and grid[k] >= 0 for k in ("x", "y", "w", "h"))
        assert grid["w"] > 0 and grid["h"] > 0 and grid["x"] + grid["w"] <= 24
        covered = {
            (x, y)
            for x in range(grid["x"], grid["x"] + grid["w"])
            for y in range(grid["y"], grid["y"] + grid["h"])
        }
        assert not covered & cells, f"panel {panel['title']!r} overlaps another"
        cells |= covered
        assert panel["datasource"]["uid"] in datasource_uids
        ref_ids = [t["refId"] for t in panel["targets"]]
        assert ref_ids and len(set(ref_ids)) == len(ref_ids)
        for target in panel["targets"]:
            assert target["expr"].strip() and target["datasource"]["uid"] in datasource_uids


def test_every_dashboard_metric_is_served(served_names: set[str]) -> None:
    expressions = [t["expr"] for p in dashboard()["panels"] for t in p["targets"]]
    names = queried(expressions)
    assert names, "the dashboard queries no memq metric"
    assert names <= served_names, names - served_names


def test_alert_rules_are_well_formed_and_use_served_metrics(served_names: set[str]) -> None:
    data = yaml.safe_load(ALERTS.read_text(encoding="utf-8"))
    rules = [rule for group in data["groups"] for rule in group["rules"]]
    assert {r["alert"] for r in rules} >= ALERTS_REQUIRED
    for rule in rules:
        assert set(rule) <= {"alert", "expr", "for", "labels", "annotations", "keep_firing_for"}
        assert rule["labels"]["severity"] in {"critical", "warning"}
        assert rule["annotations"]["summary"]
        names = queried([rule["expr"]])
        assert names and names <= served_names, (rule["alert"], names - served_names)
