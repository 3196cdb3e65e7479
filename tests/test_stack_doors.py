"""The private Redis of `memq up` gives agents only what agents need, and `memq up` never moves
to another port behind its agents' backs. A real `memq up` subprocess, the scripted model."""

from __future__ import annotations

import socket
import stat
import subprocess
from pathlib import Path

import pytest
import redis

from memq.core.settings import MemqSettings
from memq.testing.waiting import DEADLINE_SECONDS, wait_for
from producer import MemoryProducer
from producer.injector import MemoryInjector
from tests.support.memq_up import MEMQ, Up, up_env
from tests.support.openai_server import ScriptedOpenAI
from tests.support.scenarios import fact_for, learn_items, turn

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def _agent_url(up: Up) -> str:
    """The URL `memq up` printed for agents, with the password read from its 0600 file."""
    [line] = [x for x in up.text().splitlines() if "agents: export MEMQ_REDIS_URL=" in x]
    url = line.split('"')[1]
    secret_file = url.split("$(cat ")[1].split(")")[0].strip("'")
    return url.replace(f"$(cat {url.split('$(cat ')[1].split(')')[0]})", _read(secret_file))


def _read(path: str) -> str:
    assert stat.S_IMODE(Path(path).stat().st_mode) == 0o600
    return Path(path).read_text(encoding="utf-8").strip()


def test_agents_can_enqueue_and_read_memory_but_not_administer_redis(
    tmp_path: Path, openai_server: ScriptedOpenAI, ups: list[Up]
) -> None:
    openai_server.responder = learn_items
    up = Up(up_env(tmp_path, openai_server, MEMQ_STORAGE="redis"), tmp_path / "up.log")
    ups.append(up)
    up.wait_text(" ready.")
    url = _agent_url(up)
    agent = MemqSettings(redis_url=url, storage="redis")

    with MemoryProducer(agent) as producer:
        assert producer.flush("t-acl", "alice@example.com", None, turn("item-1"))
    injector = MemoryInjector(agent)
    wait_for(
        lambda: fact_for("item-1") in injector.block("alice@example.com"),
        interval=0.2,
        what="the fact, read back through the agent URL",
    )

    client = redis.Redis.from_url(url, decode_responses=True)
    try:
        for command in (
            ("CONFIG", "SET", "dir", str(tmp_path)),
            ("CONFIG", "GET", "dir"),
            ("DEBUG", "SLEEP", "0"),
            ("SAVE",),
            ("FLUSHALL",),
            ("MODULE", "LIST"),
            ("ACL", "LIST"),
            ("SHUTDOWN", "NOSAVE"),
        ):
            with pytest.raises(redis.exceptions.NoPermissionError):
                client.execute_command(*command)
        # Nor through a script: commands inside one are checked against the caller's rights.
        for script in ("return redis.call('FLUSHALL')", "return redis.call('GET', 'celery')"):
            with pytest.raises(redis.exceptions.ResponseError, match=r"can.t (run|access)"):
                client.eval(script, 0)
        # Only memq's keys: not the broker's queues.
        with pytest.raises(redis.exceptions.NoPermissionError):
            client.llen("celery")
    finally:
        client.close()
    assert up.process.poll() is None

    # The password agents hold is not the workers': those sit in a 0600 file agents are not
    # told about, and no process shows a password on its command line.
    redis_dir = tmp_path / "data" / "redis"
    worker_secret = _read(str(redis_dir / "worker-password"))
    assert worker_secret not in url
    for cmdline in Path("/proc").glob("[0-9]*/cmdline"):
        try:
            argv = cmdline.read_bytes()
        except OSError:
            continue
        assert worker_secret.encode() not in argv
    assert worker_secret not in (redis_dir / "redis.conf").read_text(encoding="utf-8")
    assert up.stop() == 0


def test_memq_up_refuses_to_start_when_its_remembered_port_is_taken(
    tmp_path: Path, openai_server: ScriptedOpenAI, ups: list[Up]
) -> None:
    """Agents were told that port: moving elsewhere would leave them sending their password and
    conversations to whatever holds it now."""
    redis_dir = tmp_path / "data" / "redis"
    redis_dir.mkdir(parents=True, mode=0o700)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        port = squatter.getsockname()[1]
        (redis_dir / "port").write_text(f"{port}\n", encoding="utf-8")
        up = Up(up_env(tmp_path, openai_server), tmp_path / "up.log")
        ups.append(up)  # stopped at teardown if it wrongly started
        code = up.process.wait(timeout=DEADLINE_SECONDS)
        text = up.text()
    assert code != 0
    lines = [line for line in text.splitlines() if str(port) in line]
    assert len(lines) == 1, text
    assert "in use" in lines[0] and "port" in lines[0]
    assert "ready." not in text
    assert (redis_dir / "port").read_text(encoding="utf-8").strip() == str(port)


def test_doctor_passes_on_memq_up_with_the_url_it_prints_or_none_at_all(
    tmp_path: Path, openai_server: ScriptedOpenAI, ups: list[Up]
) -> None:
    """The agents' ACL user may not run INFO: doctor checks as the stack's own user, and a
    process of the data folder given no URL at all finds the stack's Redis."""
    env = up_env(tmp_path, openai_server, MEMQ_STORAGE="redis")
    up = Up(env, tmp_path / "up.log")
    ups.append(up)
    up.wait_text(" ready.")
    for redis_env in ({"MEMQ_REDIS_URL": _agent_url(up)}, {}):
        doctor = subprocess.run(
            [MEMQ, "doctor"],
            env={**env, **redis_env},
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert doctor.returncode == 0, doctor.stdout + doctor.stderr
        assert "OK    redis: Redis " in doctor.stdout
        assert "OK    persistence: AOF" in doctor.stdout
        assert "NoPermissionError" not in doctor.stdout + doctor.stderr
    assert up.stop() == 0
