"""`memq up` supervises its stack (issue 13): a real `memq up` subprocess with a private Redis and
the scripted model. A worker, beat or Redis killed with SIGKILL is restarted and the stack keeps
extracting; Ctrl-C waits for the extraction in flight and stops Redis last; a restart right after
gets the same port; a second `memq up` on the same data folder refuses; an unreachable configured
Redis fails at once. Plus the pure restart policy and the local secrets of the private Redis.
"""

from __future__ import annotations

import os
import re
import signal
import stat
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest
import redis

from memq.core.settings import MemqSettings
from memq.local.redis_server import free_port
from memq.local.supervision import DataDirLock, RestartPolicy, StackLocked, restart_delay
from memq.testing.waiting import DEADLINE_SECONDS, wait_for
from producer import MemoryProducer
from tests.support.memq_up import MEMQ, Up, up_env
from tests.support.openai_server import Reply, ScriptedOpenAI
from tests.support.scenarios import fact_for, facts_of, learn_items, turn
from worker.queue import QueueClient


# --- the pure policy
@pytest.mark.parametrize(
    ("crashes", "expected"),
    [
        ([100.0], 0.5),  # first crash: a short pause
        ([99.0, 100.0], 1.0),  # doubles with each recent crash
        ([97.0, 98.0, 99.0, 100.0], 4.0),
        ([95.0, 96.0, 97.0, 98.0, 99.0], 8.0),  # capped
        ([10.0, 20.0, 100.0], 0.5),  # crashes older than the window are forgotten
        ([95.0, 96.0, 97.0, 98.0, 99.0, 100.0], None),  # six within the window: give up
    ],
)
def test_restart_delay_backs_off_and_gives_up(crashes: list[float], expected: float | None) -> None:
    policy = RestartPolicy(
        initial_backoff_seconds=0.5, max_backoff_seconds=8.0, window_seconds=60.0, max_crashes=5
    )
    assert restart_delay(crashes, 100.0, policy) == expected


def test_a_data_folder_is_locked_by_one_stack_at_a_time(tmp_path: Path) -> None:
    first = DataDirLock(tmp_path).acquire()
    with pytest.raises(StackLocked, match=f"already running on {tmp_path}.*pid {os.getpid()}"):
        DataDirLock(tmp_path).acquire()
    first.release()
    DataDirLock(tmp_path).acquire().release()  # free again once released


# --- `memq up` as a real subprocess (the `Up` process and its fixture: tests/support/memq_up.py)
def agent_settings(tmp_path: Path, port: int) -> MemqSettings:
    """What an agent uses: the URL `memq up` printed, the password from its 0600 file."""
    password = (tmp_path / "data" / "redis" / "password").read_text().strip()
    return MemqSettings(
        redis_url=f"redis://:{password}@127.0.0.1:{port}/0",
        storage="file",
        storage_dir=tmp_path / "memory",
    )


def kill9(pid: int) -> None:
    os.kill(pid, signal.SIGKILL)


def answers(settings: MemqSettings) -> bool:
    client = redis.Redis.from_url(settings.redis_url, socket_timeout=1, retry=None)
    try:
        return bool(client.ping())
    except redis.RedisError:
        return False
    finally:
        client.close()


def enqueue(settings: MemqSettings, thread: str, item: str) -> None:
    with MemoryProducer(settings) as producer:
        assert producer.flush(thread, "una", None, turn(item))


@pytest.mark.e2e
@pytest.mark.reliability
def test_memq_up_restarts_what_dies_and_keeps_extracting(
    tmp_path: Path, openai_server: ScriptedOpenAI, ups: list[Up]
) -> None:
    openai_server.responder = learn_items
    up = Up(up_env(tmp_path, openai_server), tmp_path / "up.log")
    ups.append(up)
    up.wait_text(" ready.")
    settings = agent_settings(tmp_path, up.port)

    worker = up.child("worker")
    kill9(worker)
    up.wait_text("memq up: worker exited with code -9; restarting in")
    up.wait_text(" ready.", count=2)
    assert up.child("worker") != worker

    beat = up.child("beat")
    kill9(beat)
    up.wait_text("memq up: beat exited with code -9; restarting in")
    wait_for(lambda: up.replaced("beat", beat), what="a new beat")

    redis_pid = up.child("redis")
    started = time.monotonic()
    kill9(redis_pid)
    up.wait_text("memq up: redis exited with code -9; restarting in")
    wait_for(lambda: up.replaced("redis", redis_pid), what="a new redis-server")
    wait_for(lambda: answers(settings), what="the restarted Redis answering")
    enqueue(settings, "t-sup", "item-1")  # the restarted Redis answers on the same URL
    wait_for(
        lambda: facts_of(settings, "una") == [fact_for("item-1")],
        interval=0.2,
        what="an extraction after Redis was killed and restarted",
    )
    print(
        f"\n[memq up] Redis kill -9 → next extraction saved in {time.monotonic() - started:.1f} s"
    )
    assert up.process.poll() is None
    assert up.stop() == 0
    text = up.text()
    assert "Unrecoverable error" not in text
    # An idle stack's ticks print nothing: no per-tick Celery lines at INFO.
    assert "Task memq.tick" not in text and "Sending due task" not in text
    assert len(re.findall(r"extraction key=\S+ version=\d+ outcome=updated", text)) == 1


@pytest.mark.e2e
@pytest.mark.reliability
def test_ctrl_c_finishes_the_run_in_flight_then_a_restart_gets_the_same_port_and_one_owner(
    tmp_path: Path, openai_server: ScriptedOpenAI, ups: list[Up]
) -> None:
    def slow(request: dict[str, Any]) -> Reply:
        reply = learn_items(request)
        reply.delay_seconds = 2.0
        return reply

    openai_server.responder = slow
    env = up_env(tmp_path, openai_server)
    first = Up(env, tmp_path / "up-1.log")
    ups.append(first)
    first.wait_text(" ready.")
    port = first.port
    settings = agent_settings(tmp_path, port)
    enqueue(settings, "t-ctrl-c", "item-1")
    wait_for(lambda: openai_server.call_count == 1, what="the model holds the request")

    interrupted = time.monotonic()
    assert first.stop(signal.SIGINT) == 0  # Ctrl-C: the run in flight finishes and saves first
    stopped_in = time.monotonic() - interrupted
    assert facts_of(settings, "una") == [fact_for("item-1")]
    assert "memq up: stopping" in first.text()

    second = Up(env, tmp_path / "up-2.log")
    ups.append(second)
    restarted = time.monotonic()
    second.wait_text(" ready.")
    print(
        f"\n[memq up] Ctrl-C with a 2 s call in flight: stopped in {stopped_in:.1f} s, "
        f"fact saved; restarted and ready in {time.monotonic() - restarted:.1f} s"
    )
    assert second.port == port  # TIME-WAIT is not "in use": agents keep their URL
    client = redis.Redis.from_url(settings.redis_url, decode_responses=True)
    try:
        stats = QueueClient(settings, client).stats()
    finally:
        client.close()
    assert (stats["due"], stats["inflight"], stats["dead"]) == (0, 0, 0)  # nothing half-done

    third = Up(env, tmp_path / "up-3.log")
    ups.append(third)
    assert third.process.wait(timeout=DEADLINE_SECONDS) == 1
    lines = [line for line in third.text().splitlines() if line.strip()]
    assert len(lines) == 1 and "another memq up is already running on" in lines[0], lines
    assert second.process.poll() is None  # the owner is untouched
    assert second.stop() == 0


def test_memq_up_fails_at_once_on_an_unreachable_configured_redis(
    tmp_path: Path, openai_server: ScriptedOpenAI
) -> None:
    url = f"redis://:secret-pw@127.0.0.1:{free_port()}/0"
    env = up_env(tmp_path, openai_server, MEMQ_REDIS_URL=url)
    done = subprocess.run(
        [MEMQ, "up", "--no-flower"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        timeout=DEADLINE_SECONDS,
    )
    err = done.stderr.decode()
    assert done.returncode == 1
    assert err.count("\n") == 1 and err.startswith("memq up: cannot reach Redis at redis://")
    assert "secret-pw" not in err and "***" in err
    assert not (tmp_path / "data" / "redis").exists()  # no private Redis was started instead


@pytest.mark.integration
def test_the_private_redis_keeps_its_secrets_off_argv(tmp_path: Path) -> None:
    from memq.local.options import StackOptions
    from memq.local.stack import Stack

    settings = MemqSettings(data_dir=tmp_path / "data", redis_appendfsync="always")
    stack = Stack(settings, StackOptions(worker=False, beat=False, flower=False)).start()
    try:
        server = stack.redis_server
        assert server is not None and server.process is not None
        data = tmp_path / "data"
        password_file = data / "redis" / "password"
        password = password_file.read_text().strip()
        assert len(password) >= 24
        for path, mode in ((data, 0o700), (data / "redis", 0o700), (password_file, 0o600)):
            assert stat.S_IMODE(path.stat().st_mode) == mode, path
        assert stat.S_IMODE((data / "redis" / "redis.conf").stat().st_mode) == 0o600
        argv = Path(f"/proc/{server.process.pid}/cmdline").read_bytes().decode()
        assert password not in argv
        with pytest.raises(redis.AuthenticationError):
            redis.Redis(port=server.port, protocol=2).ping()  # no password, no entry
        client = redis.Redis.from_url(stack.redis_url)
        assert client.config_get("appendfsync") == {"appendfsync": "always"}
        client.close()
        env = stack._child_env()
        # Children log in as the worker user, its password given through the environment.
        worker_file = data / "redis" / "worker-password"
        assert stat.S_IMODE(worker_file.stat().st_mode) == 0o600
        worker_password = worker_file.read_text().strip()
        assert worker_password not in argv and password not in env["MEMQ_REDIS_URL"]
        assert f"memq-worker:{worker_password}@" in env["MEMQ_REDIS_URL"]
    finally:
        stack.stop()
    # The next start of this data folder reuses the password agents were given.
    again = Stack(settings, StackOptions(worker=False, beat=False, flower=False)).start()
    try:
        assert password in again.agent_url and worker_password in again.redis_url
    finally:
        again.stop()


# --- quiet logs
def _record(name: str, level: int, msg: str, exc: BaseException | None = None) -> Any:
    import logging

    exc_info = (type(exc), exc, None) if exc is not None else None
    return logging.LogRecord(name, level, __file__, 1, msg, None, exc_info)


def test_per_task_chatter_is_dropped_at_info_and_failures_always_pass() -> None:
    import logging

    from worker.logs import OutageTracebackFilter, TaskChatterFilter

    chatter = TaskChatterFilter()
    logging.getLogger("celery.app.trace").setLevel(logging.INFO)
    try:
        assert not chatter.filter(_record("celery.app.trace", logging.INFO, "Task %(name)s ok"))
        assert not chatter.filter(
            _record("celery.beat", logging.INFO, "Scheduler: Sending due task %s (%s)")
        )
        assert chatter.filter(_record("celery.beat", logging.INFO, "beat: Starting..."))
        assert chatter.filter(_record("celery.app.trace", logging.ERROR, "Task %(name)s raised"))
        logging.getLogger("celery.app.trace").setLevel(logging.DEBUG)
        assert chatter.filter(_record("celery.app.trace", logging.INFO, "Task %(name)s ok"))
    finally:
        logging.getLogger("celery.app.trace").setLevel(logging.NOTSET)

    outage = _record("celery.beat", logging.ERROR, "Couldn't apply", redis.ConnectionError("x"))
    assert OutageTracebackFilter().filter(outage) and outage.exc_info is None  # one line
    bug = _record("celery.beat", logging.ERROR, "Couldn't apply", KeyError("x"))
    assert OutageTracebackFilter().filter(bug) and bug.exc_info is not None  # keeps its traceback
