"""docker-compose.yml, Dockerfile and Procfile cannot run here (no Docker engine): check that they
parse, name what the README documents, and that every command's entry point resolves."""

from __future__ import annotations

import importlib
import re
import shlex
from importlib.metadata import entry_points
from pathlib import Path
from typing import Any

import pytest
import yaml
from celery import Celery
from celery.bin.celery import celery as celery_cli

ROOT = Path(__file__).resolve().parent.parent
SERVICES = {"redis", "worker", "beat", "flower", "exporter", "serve", "prometheus", "grafana"}
MONITORING = {"prometheus", "grafana"}  # the `monitoring` profile


def compose() -> dict[str, Any]:
    data = yaml.safe_load((ROOT / "docker-compose.yml").read_text(encoding="utf-8"))
    assert isinstance(data, dict)
    return data


def procfile() -> dict[str, str]:
    entries: dict[str, str] = {}
    for line in (ROOT / "Procfile").read_text(encoding="utf-8").splitlines():
        if line.strip() and not line.startswith("#"):
            name, _, command = line.partition(":")
            entries[name.strip()] = command.strip()
    return entries


def assert_entry_point_resolves(argv: list[str]) -> None:
    """`celery -A worker.app <sub>` → an importable Celery app and a known sub-command;
    `memq <sub>` → the installed console script."""
    if argv[0] == "celery":
        app_path = argv[argv.index("-A") + 1]
        module_name, _, attr = app_path.rpartition(".")
        app = getattr(importlib.import_module(module_name), attr)
        assert isinstance(app, Celery)
        assert {"memq.extract", "memq.tick"} <= set(app.tasks)
        sub = next(arg for arg in argv[argv.index("-A") + 2 :] if not arg.startswith("-"))
        assert sub in celery_cli.commands, f"celery has no sub-command {sub!r}"
    elif argv[0] == "memq":
        (script,) = [ep for ep in entry_points(group="console_scripts") if ep.name == "memq"]
        assert callable(script.load())
    else:
        pytest.fail(f"unexpected program {argv[0]!r}")


def test_compose_parses_and_names_every_documented_service() -> None:
    services = compose()["services"]
    assert set(services) == SERVICES
    readme = (ROOT / "README.md").read_text(encoding="utf-8")
    for name in services:
        assert f"`{name}`" in readme, f"README does not document the compose service {name}"


def test_compose_redis_persists_and_never_evicts() -> None:
    command = " ".join(compose()["services"]["redis"]["command"])
    assert "--appendonly yes" in command
    assert "--maxmemory-policy noeviction" in command


def test_compose_redis_requires_a_password_kept_off_argv() -> None:
    """A Redis without a password is open to anything on its network; a password on argv is
    open to every user of the host (`ps`)."""
    redis = compose()["services"]["redis"]
    assert redis["environment"]["REDIS_PASSWORD"].startswith("${REDIS_PASSWORD:?")
    script = redis["entrypoint"][2]
    assert "requirepass $$REDIS_PASSWORD" in script and 'exec "$$server" -' in script
    assert not any("requirepass" in arg or "PASSWORD" in arg for arg in redis["command"])
    assert "REDISCLI_AUTH" in redis["healthcheck"]["test"][1]
    assert "REDIS_PASSWORD" in (ROOT / "docs" / "operations.md").read_text(encoding="utf-8")


def test_compose_worker_scales_and_flower_is_protected() -> None:
    services = compose()["services"]
    worker = services["worker"]
    # --scale worker=N fails with a fixed container name or a published port.
    assert "container_name" not in worker and "ports" not in worker
    flower = services["flower"]
    assert flower["ports"] == ["127.0.0.1:5555:5555"]
    assert "FLOWER_BASIC_AUTH" in flower["environment"]
    for name in ("worker", "beat", "flower", "exporter", "serve"):
        env = services[name]["environment"]
        assert env["MEMQ_REDIS_URL"] == (
            "redis://:${REDIS_PASSWORD:?set REDIS_PASSWORD (URL-safe)}@redis:6379/0"
        )
        assert env["MEMQ_STORAGE"] == "redis"  # one memory for every worker container


@pytest.mark.parametrize("service", ["worker", "beat", "flower", "exporter", "serve"])
def test_compose_commands_resolve(service: str) -> None:
    assert_entry_point_resolves(compose()["services"][service]["command"])


def test_compose_monitoring_profile_loads_the_shipped_files() -> None:
    services = compose()["services"]
    assert {n for n, s in services.items() if "monitoring" in s.get("profiles", [])} == MONITORING
    for name in SERVICES - MONITORING:
        assert "profiles" not in services[name]  # a plain `up` starts the memq stack alone
    for name in MONITORING | {"exporter", "serve"}:
        for port in services[name]["ports"]:
            assert port.startswith("127.0.0.1:")
        for volume in services[name].get("volumes", []):
            source = volume.split(":")[0]
            if source.startswith("./"):
                assert (ROOT / source).exists(), f"{name} mounts missing {source}"
    prometheus = yaml.safe_load((ROOT / "deploy/prometheus/prometheus.yml").read_text())
    targets = [
        t
        for job in prometheus["scrape_configs"]
        for c in job["static_configs"]
        for t in c["targets"]
    ]
    assert "exporter:9808" in targets
    assert prometheus["rule_files"] == ["/etc/prometheus/alerts.yml"]


def test_procfile_has_worker_beat_flower_exporter_serve() -> None:
    entries = procfile()
    assert set(entries) == {"worker", "beat", "flower", "exporter", "serve"}
    assert "--max-tasks=" in entries["flower"]
    # The password comes from the environment (Flower reads FLOWER_BASIC_AUTH), never argv.
    assert "--basic-auth" not in entries["flower"]
    assert "${FLOWER_BASIC_AUTH:?" in entries["flower"]  # no Flower without a password
    assert "--address=127.0.0.1" in entries["flower"]


@pytest.mark.parametrize("name", ["worker", "beat", "flower", "exporter", "serve"])
def test_procfile_commands_resolve(name: str) -> None:
    command = procfile()[name].rpartition("&& exec ")[2]  # after the flower's env guard
    assert_entry_point_resolves(shlex.split(command))


def test_compose_serve_needs_keys_and_publishes_on_loopback_only() -> None:
    serve = compose()["services"]["serve"]
    assert "--host=0.0.0.0" in serve["command"]  # inside the container: the proxy reaches it
    assert serve["environment"]["MEMQ_SERVE_API_KEYS"].startswith("${MEMQ_SERVE_API_KEYS:?")
    assert serve["ports"] == ["127.0.0.1:8790:8790"]


def test_memq_console_script_resolves() -> None:
    assert_entry_point_resolves(["memq", "up"])


def test_dockerfile_installs_every_package_and_runs_a_worker() -> None:
    dockerfile = (ROOT / "Dockerfile").read_text(encoding="utf-8")
    pyproject = (ROOT / "pyproject.toml").read_text(encoding="utf-8")
    packages = re.search(r"packages = \[([^\]]*)\]", pyproject)
    assert packages is not None
    for package in re.findall(r'"([^"]+)"', packages.group(1)):
        top = package.split(".")[0]  # a subpackage comes with its parent's folder
        assert f"COPY {top} ./{top}" in dockerfile
    copied = re.findall(r"^COPY (\S+) \./\S+$", dockerfile, re.MULTILINE)
    missing = [folder for folder in copied if not (ROOT / folder).exists()]
    assert missing == [], f"the Dockerfile copies folders that do not exist: {missing}"
    cmd = re.search(r"^CMD (\[.*\])$", dockerfile, re.MULTILINE)
    assert cmd is not None
    assert_entry_point_resolves(yaml.safe_load(cmd.group(1)))
