"""What every benchmark shares: the result record, percentiles, the embedded Redis and settings.

Each benchmark module exposes ``run(env: BenchEnv) -> Result``. Baselines are measured in the same
run, interleaved with the subject where that makes sense, so the ratios survive a noisy machine.
"""

from __future__ import annotations

import os
import platform
import subprocess
import uuid
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis

from bench.guard import Ratio
from memq.core.settings import MemqSettings
from memq.local.redis_server import RedisServer, find_redis_server


@dataclass
class Result:
    """One benchmark's outcome: the headline, its baseline and ratio, the goal, and whether it met
    it (``None`` when the goal cannot be judged in this run)."""

    key: str
    title: str
    measured: str
    baseline: str
    goal: str
    met: bool | None
    details: list[str] = field(default_factory=list)
    note: str = ""
    # The run's ratios by name, compared by bench.guard with the last committed figures.
    ratios: dict[str, Ratio] = field(default_factory=dict)

    @property
    def verdict(self) -> str:
        return {True: "met", False: "MISSED", None: "n/a"}[self.met]


@dataclass
class BenchEnv:
    """The embedded Redis and scratch folder of one ``python -m bench`` run."""

    server: RedisServer
    work_dir: Path
    quick: bool = False
    locomo: Path | None = None  # RECALL's data set (`--locomo`); None: the shipped sample

    @property
    def redis_url(self) -> str:
        return self.server.url

    def settings(self, **overrides: Any) -> MemqSettings:
        """Settings on the bench Redis, with a fresh key prefix so benchmarks never collide."""
        prefix = f"b{uuid.uuid4().hex[:8]}"
        values: dict[str, Any] = {
            "redis_url": self.redis_url,
            "key_prefix": prefix,
            "storage_dir": self.work_dir / prefix / "memory",
            "data_dir": self.work_dir / prefix / "data",
            "llm_provider": "rules",
        }
        values.update(overrides)
        return MemqSettings(**values)

    def client(self, *, decode_responses: bool = True) -> redis.Redis:
        return redis.Redis.from_url(self.redis_url, decode_responses=decode_responses)

    def flush_redis(self) -> None:
        # FLUSHALL of a million keys outlasts redis-py's 5 s default socket timeout on a loaded
        # machine: this one call may take as long as it needs.
        client = redis.Redis.from_url(self.redis_url, socket_timeout=300)
        try:
            client.flushall()
        finally:
            client.close()


@contextmanager
def bench_env(work_dir: Path, *, quick: bool, locomo: Path | None = None) -> Iterator[BenchEnv]:
    """A private redis-server (no AOF: we measure memq, not the disk) for the whole run."""
    server = RedisServer(work_dir / "redis", appendonly=False)
    server.start()
    try:
        yield BenchEnv(server=server, work_dir=work_dir, quick=quick, locomo=locomo)
    finally:
        server.stop()


def percentile(samples: Sequence[float], pct: float) -> float:
    """Nearest-rank percentile of ``samples`` (``pct`` in 0..100)."""
    if not samples:
        return float("nan")
    ordered = sorted(samples)
    rank = max(0, min(len(ordered) - 1, round(pct / 100 * len(ordered) + 0.5) - 1))
    return ordered[rank]


def fmt_ms(seconds: float) -> str:
    return f"{seconds * 1000:.3f} ms"


def redis_version(env: BenchEnv) -> str:
    client = env.client()
    try:
        return str(client.info("server").get("redis_version", "?"))
    finally:
        client.close()


def machine_info(env: BenchEnv) -> dict[str, str]:
    cpu = platform.processor() or platform.machine()
    try:
        for line in Path("/proc/cpuinfo").read_text(encoding="utf-8").splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    try:
        server_path = find_redis_server()
        server_banner = subprocess.run(
            [server_path, "--version"], capture_output=True, text=True, timeout=10, check=False
        ).stdout.strip()
    except Exception:  # the version line is informative only
        server_banner = ""
    return {
        "CPU": cpu,
        "cores": str(os.cpu_count() or "?"),
        "OS": f"{platform.system()} {platform.release()}",
        "Python": platform.python_version(),
        "Redis": redis_version(env) + (f" ({server_banner})" if server_banner else ""),
    }


@contextmanager
def scripted_llm(responder: Callable[[dict[str, Any]], Any] | None = None) -> Iterator[Any]:
    """The scripted OpenAI-compatible server of the tests, on loopback, always stopped."""
    from memq.testing.openai_server import ScriptedOpenAI

    server = ScriptedOpenAI(responder).start()
    try:
        yield server
    finally:
        server.stop()


def llm_settings(env: BenchEnv, server: Any, **overrides: Any) -> MemqSettings:
    values: dict[str, Any] = {
        "llm_provider": "openai",
        "llm_base_url": server.base_url,
        "llm_api_key": "sk-bench",
        "llm_max_retries": 0,
        "llm_timeout_seconds": 10.0,
    }
    values.update(overrides)
    return env.settings(**values)


@contextmanager
def celery_stack(
    env: BenchEnv,
    settings: MemqSettings,
    *,
    workers: int = 1,
    concurrency: int = 4,
    beat: bool = True,
) -> Iterator[Any]:
    """Real ``celery worker`` (threads pool) and ``beat`` processes with ``settings``, started
    with the tests' helper and always stopped (SIGTERM, then SIGKILL), Ctrl-C included."""
    from memq.testing.celery_procs import CeleryProcs, memq_env

    procs = CeleryProcs(env.work_dir / "celery" / settings.key_prefix)
    variables = memq_env(settings)
    try:
        for _ in range(workers):
            procs.start_worker(variables, concurrency=concurrency, pool="threads")
        if beat:
            procs.start_beat(variables)
        yield procs
    finally:
        procs.stop()


def start_beat(procs: Any, settings: MemqSettings) -> None:
    from memq.testing.celery_procs import memq_env

    procs.start_beat(memq_env(settings))


def flush_backlog(settings: MemqSettings, contexts: int, users: int) -> None:
    """A backlog of ``contexts`` one-turn conversations over ``users`` users, all flushed (due at
    once), handed over before any worker starts: throughput is then the workers' alone."""
    from producer.producer import MemoryProducer

    with MemoryProducer(settings) as producer:
        for index in range(contexts):
            messages = [
                {"role": "user", "content": f"Context {index}: I ship billing in Go."},
                {"role": "assistant", "content": "Noted."},
            ]
            if not producer.flush(f"t{index}", f"user-{index % users}", None, messages):
                raise RuntimeError("flush was not enqueued")
