"""Workers publish where they store memory; a reader configured for another place says so in one
line (the injector, the DeerFlow backend, ``memq doctor``) instead of showing an empty memory.
Real redis-server; the publication at start comes from a real Celery worker process."""

from __future__ import annotations

import logging
import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from memq.commands.doctor import check_workers_storage
from memq.core.settings import MemqSettings
from memq.testing.celery_procs import memq_env
from producer.injector import MemoryInjector
from storage import get_storage
from storage.document import Fact, MemoryDocument
from storage.location import check_reader, forget_checks, location_of, publish, published
from tests.support.celery_procs import CeleryProcs
from tests.support.waiting import wait_for

STANDIN = Path(__file__).parent / "support" / "deerflow_standin"
if str(STANDIN) not in sys.path:
    sys.path.insert(0, str(STANDIN))

pytestmark = pytest.mark.integration


@pytest.fixture(autouse=True)
def _fresh_checks() -> None:
    forget_checks()


def _file_settings(make_settings: Any, folder: Path) -> MemqSettings:
    return make_settings(storage="file", storage_dir=folder)  # type: ignore[no-any-return]


def test_a_worker_publishes_its_place_at_start(
    make_settings: Any, celery_procs: CeleryProcs, redis_client: redis.Redis, tmp_path: Path
) -> None:
    settings = _file_settings(make_settings, tmp_path / "worker-memory")
    assert published(redis_client, settings) is None
    celery_procs.start_worker(memq_env(settings))
    workers = wait_for(lambda: published(redis_client, settings), what="the published place")
    assert workers.backend == "file"
    assert workers.folder == str((tmp_path / "worker-memory").resolve())
    assert workers.same_place(location_of(settings))


def test_injector_says_in_one_line_when_it_reads_elsewhere(
    make_settings: Any, redis_client: redis.Redis, tmp_path: Path, caplog: Any
) -> None:
    workers = _file_settings(make_settings, tmp_path / "workers")
    publish(redis_client, workers)
    get_storage(workers).save("u", None, MemoryDocument(facts=[Fact(content="Likes tea")]))
    reader = _file_settings(make_settings, tmp_path / "gateway")
    caplog.set_level(logging.WARNING, logger="memq.storage")
    assert MemoryInjector(reader).block("u") == ""  # looks empty: the reason is logged
    wait_for(lambda: _lines(caplog), what="the warning line")
    MemoryInjector(reader).block("u")  # once per process, not per turn
    lines = _lines(caplog)
    assert len(lines) == 1
    assert str(tmp_path / "workers") in lines[0] and str(tmp_path / "gateway") in lines[0]
    assert "\n" not in lines[0] and "MEMQ_STORAGE_DIR" in lines[0]
    # The same folder (checked once on its own): silent, and the memory is there.
    caplog.clear()
    assert check_reader(workers, "injector") is None
    assert "Likes tea" in MemoryInjector(workers).block("u")
    assert not _lines(caplog)


def _lines(caplog: Any) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "memq.storage"]


def test_redis_storage_readers_and_file_workers_disagree(
    make_settings: Any, redis_client: redis.Redis, tmp_path: Path
) -> None:
    publish(redis_client, _file_settings(make_settings, tmp_path / "w"))
    reader = make_settings(storage="redis")
    [check] = check_workers_storage(redis_client, reader)
    assert check.status == "fail" and "Redis storage" in check.detail
    assert "MEMQ_STORAGE" in check.fix


def test_doctor_says_ok_or_not_started(
    make_settings: Any, redis_client: redis.Redis, tmp_path: Path
) -> None:
    settings = _file_settings(make_settings, tmp_path / "m")
    [check] = check_workers_storage(redis_client, settings)
    assert check.status == "warn" and "no worker" in check.detail
    publish(redis_client, settings)
    [check] = check_workers_storage(redis_client, settings)
    assert check.status == "ok" and str((tmp_path / "m").resolve()) in check.detail
    # An unreadable value is "no worker has published", never a crash.
    redis_client.set(f"{settings.key_prefix}:workers:storage", "{not json")
    assert check_workers_storage(redis_client, settings)[0].status == "warn"


def test_deerflow_gateway_reads_where_the_workers_write(
    make_settings: Any,
    redis_client: redis.Redis,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: Any,
) -> None:
    """The gateway gets DeerFlow's ``storage_path`` injected while the workers use
    ``MEMQ_STORAGE_DIR``: the explicit setting wins, so both use one folder; a gateway that
    still reads elsewhere says so once, at warm-up."""
    from deerflow.agents.memory.manager import build_memory_manager

    workers = _file_settings(make_settings, tmp_path / "shared")
    publish(redis_client, workers)
    config = {
        "redis_url": workers.redis_url,
        "key_prefix": workers.key_prefix,
        "storage": "file",
        "llm_provider": "rules",
    }
    monkeypatch.setenv("MEMQ_STORAGE_DIR", str(tmp_path / "shared"))
    manager = build_memory_manager(
        "memq.integrations.deerflow:MemqMemoryManager",
        config,
        storage_path=str(tmp_path / "deer-flow-home"),
    )
    assert manager.settings.storage_dir == tmp_path / "shared"  # type: ignore[attr-defined]
    with caplog.at_level(logging.WARNING, logger="memq.storage"):
        assert manager.warm() is True
    assert not [r for r in caplog.records if r.name == "memq.storage"]
    manager.close()

    monkeypatch.delenv("MEMQ_STORAGE_DIR")
    forget_checks()
    manager = build_memory_manager(
        "memq.integrations.deerflow:MemqMemoryManager",
        config,
        storage_path=str(tmp_path / "deer-flow-home"),
    )
    assert manager.settings.storage_dir == tmp_path / "deer-flow-home" / "memq"  # type: ignore[attr-defined]
    with caplog.at_level(logging.WARNING, logger="memq.storage"):
        manager.warm()
    [line] = [r.getMessage() for r in caplog.records if r.name == "memq.storage"]
    assert str(tmp_path / "shared") in line and "DeerFlow backend" in line
    manager.close()


def test_memq_doctor_prints_one_line_when_workers_store_elsewhere(
    make_settings: Any,
    redis_client: redis.Redis,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    from memq.cli import main

    workers = _file_settings(make_settings, tmp_path / "workers")
    publish(redis_client, workers)
    monkeypatch.setenv("MEMQ_REDIS_URL", workers.redis_url)
    monkeypatch.setenv("MEMQ_KEY_PREFIX", workers.key_prefix)
    monkeypatch.setenv("MEMQ_LLM_PROVIDER", "rules")
    monkeypatch.setenv("MEMQ_STORAGE", "file")
    monkeypatch.setenv("MEMQ_STORAGE_DIR", str(tmp_path / "elsewhere"))
    assert main(["doctor"]) == 1
    [line] = [x for x in capsys.readouterr().out.splitlines() if "workers' storage" in x]
    assert line.startswith("FAIL  workers' storage: workers store memory in file storage")
    assert str(tmp_path / "workers") in line and str(tmp_path / "elsewhere") in line


def test_a_hostile_published_place_is_shown_escaped_and_bounded(
    make_settings: Any, redis_client: redis.Redis, tmp_path: Path
) -> None:
    settings = _file_settings(make_settings, tmp_path / "m")
    hostile = (
        '{"backend": "file", "folder": "/x\\u001b[2K\\u202e' + "y" * 10_000 + '", "host": "h\\n"}'
    )
    redis_client.set(f"{settings.key_prefix}:workers:storage", hostile)
    [check] = check_workers_storage(redis_client, settings)
    assert check.status == "fail"
    assert "\x1b" not in check.detail and "\u202e" not in check.detail and "\n" not in check.detail
    assert "\\x1b[2K" in check.detail and len(check.detail) < 1000
