"""With default settings every process of a deployment shares one memory: an agent process started
in another working directory (as on another host sharing only Redis) reads what a real worker wrote.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from memq.core.settings import MemqSettings
from memq.local.redis_server import RedisServer
from memq.testing.waiting import DEADLINE_SECONDS, wait_for
from tests.support.celery_procs import REPO_ROOT, CeleryProcs
from worker.queue import QueueClient

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

AGENT = textwrap.dedent(
    """
    import sys
    from producer import MemoryProducer, MemoryInjector

    if sys.argv[1] == "produce":
        messages = [
            {"role": "user", "content": "I'm Dora, a pilot in Oslo. I prefer short answers."},
            {"role": "assistant", "content": "Noted, Dora."},
        ]
        with MemoryProducer() as producer:
            assert producer.flush("thread-cwd", "dora", None, messages)
    else:
        print(MemoryInjector().block("dora", None))
    """
)


def run_agent(command: str, cwd: Path, env: dict[str, str]) -> str:
    done = subprocess.run(
        [sys.executable, "-c", AGENT, command],
        cwd=cwd,
        env=env,
        capture_output=True,
        text=True,
        timeout=DEADLINE_SECONDS,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_an_agent_in_another_directory_reads_what_the_worker_wrote(
    redis_server: RedisServer,
    key_prefix: str,
    celery_procs: CeleryProcs,
    redis_client: object,
    tmp_path: Path,
) -> None:
    # Only what a deployment must say: where Redis is. Storage, folders: all defaults.
    env = {
        "MEMQ_REDIS_URL": redis_server.url,
        "MEMQ_KEY_PREFIX": key_prefix,
        "MEMQ_DEBOUNCE_SECONDS": "0",
        "MEMQ_TICK_SECONDS": "0.2",
    }
    celery_procs.start_worker(env)  # its working directory is the repository
    celery_procs.start_beat(env)
    agent_dir = tmp_path / "agent-elsewhere"
    agent_dir.mkdir()
    agent_env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    agent_env.pop("OPENAI_API_KEY", None)
    agent_env.update(env, PYTHONPATH=str(REPO_ROOT))

    run_agent("produce", agent_dir, agent_env)
    queue = QueueClient(
        MemqSettings(redis_url=redis_server.url, key_prefix=key_prefix), redis_client
    )  # type: ignore[arg-type]

    def extracted() -> bool:
        stats = queue.stats()
        return bool(stats["completed_total"]) and stats["due"] + stats["inflight"] == 0

    wait_for(extracted, interval=0.1, what="the worker extracted the thread")

    block = run_agent("read", agent_dir, agent_env)
    assert "User prefers short answers" in block and "User's name is Dora" in block, block
    assert not (agent_dir / ".memq").exists()
