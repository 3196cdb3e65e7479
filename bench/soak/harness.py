"""Runs the soak: the whole stack on loopback, steady load, a fault schedule, then the oracle.

Redis (AOF, appendfsync per run) holds the queue, the broker and the memory (``storage=redis``);
a prefork and a threads Celery worker, two beats, the scripted model in this process, and agent
replicas as subprocesses (:mod:`bench.soak.agent`). Everything is stopped whatever happens.
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
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import redis
from pydantic import SecretStr

from bench.soak.collect import dump_redis, read_dead_letters, read_documents, read_turns
from bench.soak.faults import Fault, FaultRecord, schedule
from bench.soak.model import ModelProfile, SoakModel
from bench.soak.oracle import (
    DocKey,
    LossWindow,
    OracleInput,
    StoredFact,
    Turn,
    Verdict,
    judge,
)
from core.connection import redis_client
from core.keys import KeySchema
from core.settings import MemqSettings
from memq.redis_server import RedisServer
from memq.testing.celery_procs import REPO_ROOT, CeleryProcess, CeleryProcs, memq_env
from memq.testing.openai_server import ScriptedOpenAI
from memq.testing.redis_procs import kill_redis
from worker.queue import QueueClient

# Redis fsyncs its AOF once a second with everysec, so a kill -9 may drop about the last second or
# two of acknowledged writes (Redis documents "up to 2 seconds" when the disk is slow).
EVERYSEC_LOSS_WINDOW_MS = 2_000


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


@dataclass
class SoakResult:
    config: SoakConfig
    verdict: Verdict
    faults: list[FaultRecord]
    crashes: list[FaultRecord]
    producer_stats: dict[str, Any]
    queue_stats: dict[str, Any]
    model_calls: int
    model_outcomes: dict[str, int]
    drained: bool
    documents: dict[DocKey, list[StoredFact]] = field(default_factory=dict)
    turns: list[Turn] = field(default_factory=list)
    redis_dump: dict[str, str] = field(default_factory=dict)
    loss_windows: list[LossWindow] = field(default_factory=list)
    started_ms: int = 0
    forget_method: str = ""


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def forget_user(settings: MemqSettings, user_id: str) -> str:
    """Erase a user with the fullest erasure this tree has: ``storage.erasure.erase`` when it
    exists, else ``MemoryManager.forget`` (documents only). Returns what was used."""
    import importlib
    import inspect

    try:
        erasure: Any = importlib.import_module("storage.erasure")
    except ImportError:
        erasure = None
    erase = getattr(erasure, "erase", None)
    if erase is not None:
        client = redis_client(settings)
        try:
            known: dict[str, Any] = {
                "settings": settings,
                "user_id": user_id,
                "user": user_id,
                "redis": client,
                "client": client,
            }
            params = inspect.signature(erase).parameters
            erase(**{name: known[name] for name in params if name in known})
        finally:
            client.close()
        return "storage.erasure.erase"
    from storage import get_storage
    from storage.management import MemoryManager

    MemoryManager(get_storage(settings)).forget(user_id)
    return "storage.management.MemoryManager.forget (documents only)"


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
        self._kills = 0
        self.crashes: list[FaultRecord] = []  # processes that exited on their own
        self._watching = threading.Event()
        self._first_kill = self.rng.randrange(2)
        self._lock = threading.Lock()

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
            return int(stats["metrics"].get("extractions", 0))
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
                    claims[str(member)] = str(
                        client.hget(shard.context(str(member)), "claim_token") or ""
                    )
            return claims
        finally:
            client.close()

    def queue_stats(self) -> dict[str, Any]:
        client = self.client()
        try:
            return QueueClient(self.settings, client).stats()
        finally:
            client.close()

    # --- faults
    def perform(self, fault: Fault) -> FaultRecord:
        record = FaultRecord(fault, started_ms=now_ms())
        action = getattr(self, f"_fault_{fault.kind}")
        with self._lock:  # the watchdog must not restart what a fault is restarting
            action(record)
        self.say(f"fault {fault.kind}: {record.detail}")
        return record

    def _settled_claims(self, before: dict[str, str]) -> Callable[[], bool]:
        def settled() -> bool:
            try:
                now = self.inflight_claims()
            except redis.RedisError:
                return False
            return all(now.get(cid) != token for cid, token in before.items())

        return settled

    def _extraction_after(self, start: int | None) -> Callable[[], bool]:
        def advanced() -> bool:
            count = self.extractions()
            return count is not None and (start is None or count > start)

        return advanced

    def _fault_worker_kill(self, record: FaultRecord) -> None:
        # Each pool in turn, from a random first one: both get killed in a short run too.
        index = (self._kills + self._first_kill) % len(self.workers)
        self._kills += 1
        victim = self.workers[index]
        before = self.inflight_claims()
        victim.kill()
        self.paused.discard(victim.pid)
        self.workers[index] = self.procs.restart(victim)
        record.detail = (
            f"kill -9 worker {victim.pid} ({len(before)} contexts in flight), "
            f"restarted as {self.workers[index].pid}"
        )
        self._probe(record, self._settled_claims(before), "its in-flight contexts re-claimed")

    def _fault_worker_pause(self, record: FaultRecord) -> None:
        victim = self.workers[self.rng.randrange(len(self.workers))]
        before = self.inflight_claims()
        victim.pause()
        self.paused.add(victim.pid)
        record.detail = (
            f"SIGSTOP worker {victim.pid} for {record.fault.hold_seconds:g}s "
            f"(lease {self.config.lease_seconds:g}s, {len(before)} contexts in flight)"
        )

        def resume() -> None:
            if victim.pid in self.paused:
                victim.resume()
                self.paused.discard(victim.pid)
                self.say(f"SIGCONT worker {victim.pid}")

        timer = threading.Timer(record.fault.hold_seconds, resume)
        timer.daemon = True
        timer.start()
        self._probe(record, self._settled_claims(before), "in-flight contexts re-claimed")

    def _fault_redis_restart(self, record: FaultRecord) -> None:
        start = self.extractions()
        self.redis.stop()
        self.redis.start()
        record.detail = "graceful restart of Redis (SIGTERM, same port and AOF)"
        self._probe(record, self._extraction_after(start), "an extraction completed")

    def _fault_redis_kill(self, record: FaultRecord) -> None:
        start = self.extractions()
        killed = now_ms()
        kill_redis(self.redis)
        if self.config.appendfsync != "always":
            self.loss_windows.append(LossWindow(killed - EVERYSEC_LOSS_WINDOW_MS, killed))
        self.redis.start()
        record.detail = f"kill -9 of Redis, restarted from its AOF ({self.config.appendfsync})"
        self._probe(record, self._extraction_after(start), "an extraction completed")

    def _fault_beat_kill(self, record: FaultRecord) -> None:
        index = self.rng.randrange(len(self.beats))
        victim = self.beats[index]
        start = self.extractions()
        victim.kill()
        self.beats[index] = self.procs.restart(victim)
        record.detail = f"kill -9 beat {victim.pid}, restarted as {self.beats[index].pid}"
        self._probe(record, self._extraction_after(start), "an extraction completed")

    def _fault_forget(self, record: FaultRecord) -> None:
        candidates = sorted({c["user"] for c in self._conversations()} - self.forgotten)
        chosen = self.rng.sample(candidates, min(self.config.forget_users, len(candidates)))
        wanted = self.forgotten | set(chosen)
        (self.control / "forget").write_text("\n".join(sorted(wanted)) + "\n")
        acked = self._wait(lambda: self._agents_stopped_for(wanted), 60.0)
        for user in chosen:
            self.forget_method = forget_user(self.settings, user)
        self.forgotten |= set(chosen)
        record.detail = f"forgot {', '.join(chosen)} via {self.forget_method}" + (
            "" if acked else " (an agent did not confirm it stopped for them)"
        )
        record.recovered_ms = now_ms()

    def _conversations(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for path in sorted(self.control.glob("plan-*.json")):
            out.extend(json.loads(path.read_text(encoding="utf-8"))["conversations"])
        return out

    def _agents_stopped_for(self, users: set[str]) -> bool:
        for index in range(len(self.agents)):
            path = self.control / f"forget-ack-{index}"
            try:
                ack = json.loads(path.read_text(encoding="utf-8"))
            except (FileNotFoundError, ValueError):
                return False
            if not users <= set(ack["users"]) or ack["spool"]:
                return False
        return True

    @staticmethod
    def _wait(condition: Callable[[], bool], timeout: float, interval: float = 0.2) -> bool:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if condition():
                return True
            time.sleep(interval)  # wait-ok: polling a condition with a deadline
        return False

    def _probe(self, record: FaultRecord, condition: Callable[[], bool], what: str) -> None:
        """Measure recovery in the background (the next fault may be due before it)."""
        timeout = self.config.lease_seconds * 10 + 120

        def watch() -> None:
            if self._wait(condition, timeout, interval=0.1):
                record.recovered_ms = now_ms()
                self.say(
                    f"recovered from {record.fault.kind} in {record.recovery_seconds:.1f}s ({what})"
                )
            else:
                record.notes.append(f"not recovered within {timeout:g}s ({what})")
                self.say(f"NOT recovered from {record.fault.kind} within {timeout:g}s")

        threading.Thread(target=watch, daemon=True).start()

    # --- a supervisor for what dies on its own
    def watch(self) -> None:
        """Restart, like a supervisor, any worker or beat that exits without being killed by a
        fault, and record it with the last error line of its log (a finding, not a fault)."""
        self._watching.set()

        def loop() -> None:
            while self._watching.is_set():
                with self._lock:
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
        with self._lock:  # a restart in progress finishes first
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

        return self._wait(idle, self.config.drain_timeout_seconds, interval=0.5) and self._wait(
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


def run_soak(config: SoakConfig) -> SoakResult:
    faults = schedule(config.duration_seconds, config.lease_seconds)
    records: list[FaultRecord] = []
    with running_stack(config) as stack:
        stack.say(
            f"load: {config.rate:g} turns/s over {config.threads} threads of {config.users} users "
            f"and {config.agents} agents by {config.producers} agents for {config.minutes:g} min; "
            f"{len(faults)} faults scheduled"
        )
        begin = time.monotonic()
        stack.watch()
        for fault in faults:
            wait = begin + fault.at_seconds - time.monotonic()
            if wait > 0:
                time.sleep(wait)  # wait-ok: the fault schedule's clock
            try:
                records.append(stack.perform(fault))
            except Exception as exc:  # a fault the harness could not do is reported, not fatal
                record = FaultRecord(fault, started_ms=now_ms(), detail=f"FAILED: {exc!r}")
                records.append(record)
                stack.say(f"fault {fault.kind} could not be performed: {exc!r}")
        rest = begin + config.duration_seconds - time.monotonic()
        if rest > 0:
            time.sleep(rest)  # wait-ok: the run's length
        stack.say("load over: stopping the agents (their spools drain)")
        stack.stop_agents()
        stack.resume_all()
        stack.say("waiting for the queue to drain")
        drained = stack.drain()
        stack.say("drained" if drained else "NOT drained within the timeout")
        stack.unwatch()
        turns, producer_stats = read_turns(stack.control)
        client = stack.client()
        try:
            queue = QueueClient(stack.settings, client)
            queue_stats = queue.stats()
            documents, raw_documents = read_documents(stack.settings, client)
            dead = read_dead_letters(queue)
        finally:
            client.close()
        raw_client = redis.Redis.from_url(stack.settings.redis_url)
        try:
            dump = dump_redis(raw_client)
        finally:
            raw_client.close()
        verdict = judge(
            OracleInput(
                turns=turns,
                documents=documents,
                raw_documents=raw_documents,
                dead_letters=dead,
                forgotten=frozenset(stack.forgotten),
                redis_dump=dump,
                loss_windows=stack.loss_windows,
            )
        )
        return SoakResult(
            config=config,
            verdict=verdict,
            faults=records,
            crashes=list(stack.crashes),
            producer_stats=producer_stats,
            queue_stats=queue_stats,
            model_calls=stack.model.calls,
            model_outcomes=dict(stack.model.outcomes),
            drained=drained,
            documents=documents,
            turns=turns,
            redis_dump=dump,
            loss_windows=list(stack.loss_windows),
            started_ms=stack.started_ms,
            forget_method=stack.forget_method,
        )
