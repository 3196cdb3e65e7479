"""The processes of one soak on loopback, started and always stopped, with a supervisor.

Redis (AOF, appendfsync per run) holds the queue, the broker and the memory (``storage=redis``);
a prefork and a threads Celery worker, two beats, the scripted model in this process, and agent
replicas as subprocesses (:mod:`bench.soak.agent`).
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import secrets
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import redis
from pydantic import SecretStr

from bench.soak.faults import Fault, FaultRecord
from bench.soak.model import ModelProfile, SoakModel
from bench.soak.oracle import LossWindow
from memq.core.connection import redis_client
from memq.core.keys import KeySchema
from memq.core.settings import MemqSettings
from memq.local.redis_server import RedisServer
from memq.testing.celery_procs import REPO_ROOT, CeleryProcess, CeleryProcs, memq_env
from memq.testing.openai_server import ScriptedOpenAI
from worker.queue import QueueClient


@dataclass
class SoakConfig:
    minutes: float = 10.0
    rate: float = 50.0  # turns per second, all agents together
    threads: int = 500
    users: int = 100
    agents: int = 4
    producers: int = 3
    appendfsync: str = "everysec"
    prefork_concurrency: int = 4
    thread_concurrency: int = 8
    beats: int = 2
    debounce_seconds: float = 2.0
    tick_seconds: float = 0.5
    lease_seconds: float = 6.0
    flush_fraction: float = 0.10
    forget_users: int = 2  # per forget
    seed: int = 0
    drain_timeout_seconds: float = 300.0
    work_dir: Path = Path(".memq/soak")
    log: Callable[[str], None] = print

    @property
    def duration_seconds(self) -> float:
        return self.minutes * 60


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def wait_until(condition: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
    """Poll ``condition`` until it holds (True) or ``timeout`` passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(interval)  # wait-ok: polling a condition with a deadline
    return False


class Stack:
    """The processes of one soak, and the faults done to them."""

    def __init__(self, config: SoakConfig) -> None:
        self.config = config
        self.work = config.work_dir.resolve()
        self.control = self.work / "control"
        self.control.mkdir(parents=True, exist_ok=True)
        self.rng = random.Random(config.seed)
        self.redis = RedisServer(self.work / "redis", appendfsync=config.appendfsync)
        self.model = SoakModel(
            ModelProfile(
                slow_seconds=(config.lease_seconds * 1.15, config.lease_seconds * 1.4),
                timeout_seconds=config.lease_seconds * 2,
            ),
            seed=config.seed,
        )
        self.server = ScriptedOpenAI(self.model)
        self.procs = CeleryProcs(self.work / "celery")
        self.workers: list[CeleryProcess] = []
        self.beats: list[CeleryProcess] = []
        self.agents: list[subprocess.Popen[bytes]] = []
        self.paused: set[int] = set()
        self.forgotten: set[str] = set()
        self.forget_method = ""
        self.loss_windows: list[LossWindow] = []
        self.started_ms = 0
        self._settings: MemqSettings | None = None
        self.crashes: list[FaultRecord] = []  # processes that exited on their own
        self._watching = threading.Event()
        self._first_kill = self.rng.randrange(2)
        self.lock = threading.Lock()  # held while a process is killed or restarted

    @property
    def settings(self) -> MemqSettings:
        assert self._settings is not None
        return self._settings

    def say(self, text: str) -> None:
        elapsed = (now_ms() - self.started_ms) / 1000 if self.started_ms else 0.0
        self.config.log(f"[soak +{elapsed:7.1f}s] {text}")

    # --- starting and stopping
    def start(self) -> None:
        c = self.config
        self.redis.start()
        self.server.start()
        self._settings = MemqSettings(
            redis_url=self.redis.url,
            key_prefix="soak",
            storage="redis",
            storage_dir=self.work / "memory",
            data_dir=self.work / "data",
            llm_provider="openai",
            llm_base_url=self.server.base_url,
            llm_api_key=SecretStr("sk-soak"),
            llm_max_retries=0,
            llm_timeout_seconds=c.lease_seconds * 1.6,
            debounce_seconds=c.debounce_seconds,
            max_delay_seconds=max(10.0, c.debounce_seconds * 5),
            tick_seconds=c.tick_seconds,
            lease_seconds=c.lease_seconds,
            retry_backoff_seconds=0.5,
            retry_backoff_max_seconds=4.0,
            token_counting=False,
            max_facts=5000,
        )
        env = self.env()
        self.workers.append(
            self.procs.start_worker(env, concurrency=c.prefork_concurrency, pool="prefork")
        )
        self.workers.append(
            self.procs.start_worker(env, concurrency=c.thread_concurrency, pool="threads")
        )
        for _ in range(c.beats):
            self.beats.append(self.procs.start_beat(env))
        self.started_ms = now_ms()
        self.start_agents()
        self.say(
            f"started: redis :{self.redis.port} (appendfsync {c.appendfsync}), "
            f"workers {[w.pid for w in self.workers]}, beats {[b.pid for b in self.beats]}, "
            f"agents {[a.pid for a in self.agents]}, model {self.server.base_url}"
        )

    def env(self) -> dict[str, str]:
        return memq_env(self.settings, MEMQ_MAX_FACTS=str(self.settings.max_facts))

    def start_agents(self) -> None:
        c = self.config
        users = [f"su-{secrets.token_hex(4)}" for _ in range(c.users)]
        agents = [f"agent-{chr(ord('a') + i)}" for i in range(c.agents)]
        conversations = [
            {"thread": f"th-{i:05d}", "user": users[i % c.users], "agent": self.rng.choice(agents)}
            for i in range(c.threads)
        ]
        full_env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
        full_env.update(self.env())
        full_env["PYTHONPATH"] = os.pathsep.join(
            filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH", "")])
        )
        for index in range(c.producers):
            plan = {
                "index": index,
                "control_dir": str(self.control),
                "seed": c.seed * 1000 + index,
                "rate": c.rate / c.producers,
                "flush_fraction": c.flush_fraction,
                "conversations": conversations[index :: c.producers],
            }
            plan_path = self.control / f"plan-{index}.json"
            plan_path.write_text(json.dumps(plan))
            log = (self.work / f"agent-{index}.log").open("ab")
            self.agents.append(
                subprocess.Popen(
                    [sys.executable, "-m", "bench.soak.agent", str(plan_path)],
                    cwd=REPO_ROOT,
                    env=full_env,
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                )
            )
            log.close()

    def stop_agents(self, timeout: float = 120.0) -> None:
        (self.control / "stop").write_text("")
        for agent in self.agents:
            try:
                agent.wait(timeout)
            except subprocess.TimeoutExpired:
                agent.kill()
                agent.wait()
                self.say(f"agent {agent.pid} did not stop in {timeout:g}s: killed")

    def resume_all(self) -> None:
        for proc in self.workers + self.beats:
            if proc.pid in self.paused:
                proc.resume()
        self.paused.clear()

    def close(self) -> None:
        with contextlib.suppress(Exception):
            self.resume_all()
        for agent in self.agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
        with contextlib.suppress(Exception):
            self.procs.stop()
        with contextlib.suppress(Exception):
            self.server.stop()
        with contextlib.suppress(Exception):
            self.redis.stop()

    # --- observing
    def client(self) -> redis.Redis:
        return redis_client(self.settings, socket_timeout=2.0)

    def extractions(self) -> int | None:
        client = self.client()
        try:
            stats = QueueClient(self.settings, client).stats()
            return int(stats["completed_total"])
        except redis.RedisError:
            return None
        finally:
            client.close()

    def inflight_claims(self) -> dict[str, str]:
        """Context id -> claim token of everything in flight now."""
        client = self.client()
        try:
            keys = KeySchema(self.settings.key_prefix, self.settings.shards)
            claims: dict[str, str] = {}
            for shard in keys.all_shards():
                for member in client.zrange(shard.inflight, 0, -1):
                    claims[str(member)] = str(client.hget(shard.claims, str(member)) or "")
            return claims
        finally:
            client.close()

    def queue_stats(self) -> dict[str, Any]:
        client = self.client()
        try:
            return QueueClient(self.settings, client).stats()
        finally:
            client.close()

    # --- a supervisor for what dies on its own
    def watch(self) -> None:
        """Restart, like a supervisor, any worker or beat that exits without being killed by a
        fault, and record it with the last error line of its log (a finding, not a fault)."""
        self._watching.set()

        def loop() -> None:
            while self._watching.is_set():
                with self.lock:
                    if not self._watching.is_set():
                        return
                    for group in (self.workers, self.beats):
                        for index, proc in enumerate(group):
                            if not proc.alive():
                                self._revive(group, index, proc)
                time.sleep(0.5)  # wait-ok: the supervisor's polling interval

        threading.Thread(target=loop, name="soak-supervisor", daemon=True).start()

    def unwatch(self) -> None:
        self._watching.clear()
        with self.lock:  # a restart in progress finishes first
            pass

    def _revive(self, group: list[CeleryProcess], index: int, proc: CeleryProcess) -> None:
        code = proc.process.returncode
        errors = [
            line.strip()
            for line in proc.log_text().splitlines()
            if "CRITICAL" in line or "Unrecoverable" in line or line.startswith("AttributeError")
        ]
        record = FaultRecord(Fault(0.0, f"{proc.role}_crash"), started_ms=now_ms())
        try:
            group[index] = self.procs.restart(proc)
            record.detail = (
                f"{proc.role} {proc.pid} exited on its own (code {code}): "
                f"{errors[-1][:200] if errors else 'see its log ' + proc.log_path.name}; "
                f"restarted as {group[index].pid}"
            )
            record.recovered_ms = now_ms()
        except Exception as exc:
            record.detail = f"{proc.role} {proc.pid} exited (code {code}); restart failed: {exc!r}"
        self.crashes.append(record)
        self.say(f"UNPLANNED: {record.detail}")

    # --- the end
    def drain(self) -> bool:
        """Wait until nothing is due or in flight (retries with back-off included)."""

        def idle() -> bool:
            try:
                stats = self.queue_stats()
            except redis.RedisError:
                return False
            return bool(stats["due"] == 0 and stats["inflight"] == 0)

        return wait_until(idle, self.config.drain_timeout_seconds, interval=0.5) and wait_until(
            idle, 5.0
        )


@contextlib.contextmanager
def running_stack(config: SoakConfig) -> Iterator[Stack]:
    stack = Stack(config)
    try:
        stack.start()
        yield stack
    finally:
        stack.close()
