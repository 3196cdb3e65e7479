"""Several processes updating one (user, agent) at once lose no update, on both backends."""

from __future__ import annotations

import multiprocessing
from multiprocessing.synchronize import Barrier
from typing import Any

import pytest

from memq.core.settings import MemqSettings
from storage import get_storage
from storage.base import Change, UpdateResult
from storage.document import Fact, MemoryDocument

PROCESSES = 4
UPDATES_EACH = 15


def _add_facts(config: dict[str, Any], worker: int, barrier: Barrier) -> None:
    """Runs in a spawned process: its own settings, storage and connections."""
    storage = get_storage(MemqSettings(**config))
    barrier.wait(timeout=60)  # everyone starts together, so the updates really overlap
    for i in range(UPDATES_EACH):
        content = f"worker {worker} fact {i}"

        def add(document: MemoryDocument, content: str = content) -> UpdateResult:
            document.facts.append(Fact(content=content, source="manual"))
            return UpdateResult(document, [Change(action="add", content=content)])

        storage.update("alice", "coder", add)


def _run_processes(config: dict[str, Any]) -> None:
    ctx = multiprocessing.get_context("spawn")
    barrier = ctx.Barrier(PROCESSES)
    processes = [
        ctx.Process(target=_add_facts, args=(config, n, barrier)) for n in range(PROCESSES)
    ]
    for process in processes:
        process.start()
    try:
        for process in processes:
            process.join(timeout=90)
    finally:
        for process in processes:
            if process.is_alive():
                process.kill()
                process.join(timeout=5)
    assert [p.exitcode for p in processes] == [0] * PROCESSES


@pytest.mark.integration
@pytest.mark.parametrize("backend", ["file", "redis"])
def test_concurrent_updates_from_several_processes_are_all_kept(
    backend: str, make_settings: Any
) -> None:
    settings = make_settings(storage=backend, storage_lock_timeout_seconds=30)
    config = {
        "storage": backend,
        "storage_dir": str(settings.storage_dir),
        "redis_url": settings.redis_url,
        "key_prefix": settings.key_prefix,
        "storage_lock_timeout_seconds": 30,
    }

    _run_processes(config)

    storage = get_storage(settings)
    facts = [f.content for f in storage.load("alice", "coder").facts]
    expected = {f"worker {w} fact {i}" for w in range(PROCESSES) for i in range(UPDATES_EACH)}
    assert len(facts) == len(expected)
    assert set(facts) == expected
    history = storage.history("alice", "coder", limit=1000)
    assert {c.content for c in history} == expected
