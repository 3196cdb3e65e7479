"""The producer's spool on disk: a turn a process could not send survives that process (killed
-9 during an outage) and the next process started with the same data folder sends it; without a
folder, a door that may end says the turn was not kept. Through the MCP SDK's stdio client, with
no MEMQ_* environment: the data folder (`MEMQ_DATA_DIR`, or `.memq` in the working directory)
is all the process is told."""

from __future__ import annotations

import json
import os
import signal
import stat
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import anyio
import pytest
from mcp import ClientSession, StdioServerParameters, stdio_client

from memq.core.identity import ContextKey
from memq.core.settings import MemqSettings
from memq.local.redis_server import WORKER_USER, AclUser, RedisServer, agent_rules, redis_password
from memq.local.redis_server import write_private as write_private_file
from memq.testing.celery_procs import REPO_ROOT
from producer.enqueue import EnqueueRequest
from producer.spool_disk import DiskSpool
from tests.support.celery_procs import CeleryProcs, memq_env
from tests.support.openai_server import ScriptedOpenAI
from tests.support.scenarios import fact_for, learn_items, stack_settings
from tests.support.waiting import wait_for

RECALL_TIMEOUT_SECONDS = 90.0


def _request(thread: str, text: str, captured_ms: int = 1) -> EnqueueRequest:
    messages = [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]
    return EnqueueRequest(
        ContextKey(thread, "u@x.org", None), json.dumps(messages), captured_ms=captured_ms
    )


def _entries(root: Path) -> list[Path]:
    return sorted(root.glob("*/*.json"))


# --- the spool on disk, without Redis
def test_entries_are_private_and_a_sent_one_is_removed(tmp_path: Path) -> None:
    spool = DiskSpool(tmp_path / "spool", 10)
    spool.put(_request("t/1", "I live in Oslo."))
    (entry,) = _entries(tmp_path / "spool")
    assert stat.S_IMODE(entry.stat().st_mode) == 0o600
    assert stat.S_IMODE(entry.parent.stat().st_mode) == 0o700
    assert stat.S_IMODE((tmp_path / "spool").stat().st_mode) == 0o700
    (taken,) = spool.pop_batch(10)
    assert _entries(tmp_path / "spool") == [entry]  # on disk until Redis holds it
    spool.sent(taken.context_id)
    assert _entries(tmp_path / "spool") == []
    spool.close()


def test_a_live_process_spool_is_never_adopted(tmp_path: Path) -> None:
    first = DiskSpool(tmp_path / "spool", 10)
    first.put(_request("t1", "I live in Oslo."))
    second = DiskSpool(tmp_path / "spool", 10)
    assert len(second) == 0 and second.adopted == 0
    first.close()
    second.close()


def test_bounds_drop_the_oldest_contexts_and_their_files(tmp_path: Path) -> None:
    spool = DiskSpool(tmp_path / "by-count", 2)
    for n in range(3):
        spool.put(_request(f"t{n}", f"turn {n}"))
    assert [r.key.thread_id for r in spool.pop_batch(10)] == ["t1", "t2"]
    assert len(_entries(tmp_path / "by-count")) == 2
    spool.close()
    by_bytes = DiskSpool(tmp_path / "by-bytes", 100, max_bytes=10_000)
    for n in range(3):
        by_bytes.put(_request(f"t{n}", str(n) * 4_000))
    assert [r.key.thread_id for r in by_bytes.pop_batch(10)] == ["t1", "t2"]
    assert len(_entries(tmp_path / "by-bytes")) == 2
    by_bytes.close()


_ENDED_PROCESS = textwrap.dedent(
    """
    import json, os, sys
    from memq.core.identity import ContextKey
    from producer.enqueue import EnqueueRequest
    from producer.spool_disk import DiskSpool

    spool = DiskSpool(__import__("pathlib").Path(sys.argv[1]), 10)
    for n in range(3):
        text = json.dumps([{"role": "user", "content": f"turn {n}"},
                           {"role": "assistant", "content": "ok"}])
        spool.put(EnqueueRequest(ContextKey(f"t{n}", "u", None), text, captured_ms=n + 1))
    taken = spool.take("t0:u:")  # being sent when the process dies: still on disk
    os.kill(os.getpid(), 9)
    """
)


def test_the_next_process_adopts_what_a_killed_one_spooled_oldest_first(tmp_path: Path) -> None:
    root = tmp_path / "spool"
    env = {**os.environ, "PYTHONPATH": str(REPO_ROOT)}
    done = subprocess.run(
        [sys.executable, "-c", _ENDED_PROCESS, str(root)], env=env, timeout=60, check=False
    )
    assert done.returncode == -signal.SIGKILL
    assert len(_entries(root)) == 3
    spool = DiskSpool(root, 10)
    assert spool.adopted == 3
    assert [r.key.thread_id for r in spool.pop_batch(10)] == ["t0", "t1", "t2"]
    # Adopted into this process's own folder; the dead one's folder is gone.
    assert [p.name for p in root.iterdir()] == [spool._own.name]
    spool.close()


# --- through MCP over stdio, with no environment but the data folder
def _bare_env(data_dir: Path) -> dict[str, str]:
    """What an MCP client passes by default: no MEMQ_* variable (PYTHONPATH only so this tree's
    code runs), plus the data folder."""
    return {
        "PATH": os.environ.get("PATH", ""),
        "HOME": os.environ.get("HOME", str(data_dir)),
        "PYTHONPATH": str(REPO_ROOT),
        "MEMQ_DATA_DIR": str(data_dir),
    }


def _stdio(data_dir: Path) -> StdioServerParameters:
    return StdioServerParameters(
        command=sys.executable,
        args=["-m", "memq.cli", "mcp", "--user", "frank"],
        env=_bare_env(data_dir),
        cwd=str(data_dir.parent),
    )


def _text(result: Any) -> str:
    return "".join(getattr(part, "text", "") for part in result.content)


def _children_running_mcp() -> list[int]:
    pids = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit():
            continue
        try:
            ppid = int((proc / "stat").read_text().rsplit(")", 1)[1].split()[1])
            cmdline = (proc / "cmdline").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue
        if ppid == os.getpid() and b"memq.cli" in cmdline and b"mcp" in cmdline:
            pids.append(int(proc.name))
    return pids


def _private_redis(data_dir: Path) -> tuple[RedisServer, str]:
    """The Redis `memq up` runs for a data folder (its password and port files there, agents on
    the limited default user, the stack on the worker user)."""
    redis_dir = data_dir / "redis"
    worker = AclUser(WORKER_USER, redis_password(redis_dir, "worker-password"), "~* &* +@all")
    server = RedisServer(
        redis_dir,
        password=redis_password(redis_dir),
        default_rules=agent_rules("memq"),
        acl_users=[worker],
        appendonly=True,
    )
    write_private_file(redis_dir / "port", f"{server.port}\n")
    return server, server.url_for(worker)


@pytest.mark.e2e
def test_a_stdio_remember_during_an_outage_survives_kill_9_and_is_extracted(
    tmp_path: Path, openai_server: ScriptedOpenAI, celery_procs: CeleryProcs
) -> None:
    data_dir = tmp_path / "data"
    data_dir.mkdir(mode=0o700)
    server, worker_url = _private_redis(data_dir)  # known to the folder, not running: an outage
    item = "item-29"

    async def remember_then_die() -> str:
        async with (
            stdio_client(_stdio(data_dir)) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            said = await session.call_tool(
                "remember", {"text": f"Please remember that I own {item}."}
            )
            assert not said.is_error, _text(said)
            (pid,) = _children_running_mcp()
            os.kill(pid, signal.SIGKILL)
            return _text(said)

    said = _run(remember_then_die)
    assert "kept on disk" in said
    spooled = sorted((data_dir / "spool").glob("*/*/*.json"))
    assert len(spooled) == 1 and stat.S_IMODE(spooled[0].stat().st_mode) == 0o600
    assert item not in "".join(p.name for p in spooled)

    # Redis comes back, with a worker; a new `memq mcp` on the same folder sends the turn.
    server.start()
    try:
        openai_server.responder = learn_items
        settings: MemqSettings = stack_settings(
            lambda **values: MemqSettings(
                **{"redis_url": worker_url, "data_dir": data_dir, "storage": "redis", **values}
            ),
            openai_server,
        )
        env = memq_env(settings)
        celery_procs.start_worker(env, concurrency=2)
        celery_procs.start_beat(env)

        async def recall() -> str:
            async with (
                stdio_client(_stdio(data_dir)) as (read, write),
                ClientSession(read, write) as session,
            ):
                await session.initialize()
                recalled = ""
                with anyio.fail_after(RECALL_TIMEOUT_SECONDS):
                    while fact_for(item) not in recalled:
                        answer = await session.call_tool("recall", {"query": "what do I own?"})
                        recalled = _text(answer)
                        if fact_for(item) not in recalled:
                            await anyio.sleep(0.2)  # wait-ok: polling the worker under a deadline
                listed = await session.call_tool("list_facts", {})
                return _text(listed)

        listed = _run(recall)
        assert listed.count(fact_for(item)) == 1
        wait_for(
            lambda: not list((data_dir / "spool").glob("*/*/*.json")),
            what="the replayed entry removed",
        )
    finally:
        server.stop()


def test_without_a_data_folder_a_stdio_remember_says_the_turn_was_not_kept(
    tmp_path: Path,
) -> None:
    nowhere = tmp_path / "no-data"  # does not exist: no folder to keep a spool in
    params = _stdio(nowhere)
    params.env = {**(params.env or {}), "MEMQ_REDIS_URL": "redis://127.0.0.1:9/0"}  # refused

    async def main() -> str:
        async with stdio_client(params) as (read, write), ClientSession(read, write) as session:
            await session.initialize()
            said = await session.call_tool("remember", {"text": "Please remember I own a boat."})
            assert said.is_error
            return _text(said)

    said = _run(main)
    assert "not kept" in said and "unreachable" in said
    assert "will be remembered" not in said


def _run(main: Any) -> Any:
    out: list[Any] = []

    async def wrapper() -> None:
        out.append(await main())

    anyio.run(wrapper)
    return out[0]
