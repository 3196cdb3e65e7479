"""Doing the soak's faults to a running :class:`bench.soak.stack.Stack`, and timing recovery."""

from __future__ import annotations

import json
import threading
from collections.abc import Callable
from typing import Any

import redis

from bench.soak.faults import Fault, FaultRecord
from bench.soak.oracle import LossWindow
from bench.soak.stack import Stack, now_ms, wait_until
from memq.core.connection import redis_client
from memq.core.settings import MemqSettings
from memq.testing.redis_procs import kill_redis
from memq.testing.waiting import DEADLINE_SECONDS

# Redis fsyncs its AOF once a second with everysec, so a kill -9 may drop about the last second or
# two of acknowledged writes (Redis documents "up to 2 seconds" when the disk is slow).
EVERYSEC_LOSS_WINDOW_MS = 2_000


def forget_user(settings: MemqSettings, user_id: str) -> str:
    """Erase a user as `memq forget` does (documents, queued work, watermarks, per-user sets);
    returns what was removed, by kind."""
    from storage import get_storage
    from storage.erasure import erase

    client = redis_client(settings)
    try:
        report = erase(settings, client, get_storage(settings, redis=client), user_id)
    finally:
        client.close()
    return report.describe()


class FaultRunner:
    """Performs each :class:`bench.soak.faults.Fault` on ``stack`` and measures its recovery in
    the background (the next fault may be due before it)."""

    def __init__(self, stack: Stack) -> None:
        self.stack = stack
        self._kills = 0
        self._first_kill = stack.rng.randrange(2)

    def perform(self, fault: Fault) -> FaultRecord:
        record = FaultRecord(fault, started_ms=now_ms())
        action = getattr(self, f"_fault_{fault.kind}")
        if fault.kind == "forget":
            action(record)
        else:
            with self.stack.lock:  # the supervisor must not restart what a fault restarts
                action(record)
        self.stack.say(f"fault {fault.kind}: {record.detail}")
        return record

    def _settled_claims(self, before: dict[str, str]) -> Callable[[], bool]:
        def settled() -> bool:
            try:
                now = self.stack.inflight_claims()
            except redis.RedisError:
                return False
            return all(now.get(cid) != token for cid, token in before.items())

        return settled

    def _extraction_after(self, start: int | None) -> Callable[[], bool]:
        def advanced() -> bool:
            count = self.stack.extractions()
            return count is not None and (start is None or count > start)

        return advanced

    def _fault_worker_kill(self, record: FaultRecord) -> None:
        # Each pool in turn, from a random first one: both get killed in a short run too.
        index = (self._kills + self._first_kill) % len(self.stack.workers)
        self._kills += 1
        victim = self.stack.workers[index]
        before = self.stack.inflight_claims()
        victim.kill()
        self.stack.paused.discard(victim.pid)
        self.stack.workers[index] = self.stack.procs.restart(victim)
        record.detail = (
            f"kill -9 worker {victim.pid} ({len(before)} contexts in flight), "
            f"restarted as {self.stack.workers[index].pid}"
        )
        self._probe(record, self._settled_claims(before), "its in-flight contexts re-claimed")

    def _fault_worker_pause(self, record: FaultRecord) -> None:
        victim = self.stack.workers[self.stack.rng.randrange(len(self.stack.workers))]
        before = self.stack.inflight_claims()
        victim.pause()
        self.stack.paused.add(victim.pid)
        record.detail = (
            f"SIGSTOP worker {victim.pid} for {record.fault.hold_seconds:g}s "
            f"(lease {self.stack.config.lease_seconds:g}s, {len(before)} contexts in flight)"
        )

        def resume() -> None:
            if victim.pid in self.stack.paused:
                victim.resume()
                self.stack.paused.discard(victim.pid)
                self.stack.say(f"SIGCONT worker {victim.pid}")

        timer = threading.Timer(record.fault.hold_seconds, resume)
        timer.daemon = True
        timer.start()
        self._probe(record, self._settled_claims(before), "in-flight contexts re-claimed")

    def _fault_redis_restart(self, record: FaultRecord) -> None:
        start = self.stack.extractions()
        self.stack.redis.stop()
        self.stack.redis.start()
        record.detail = "graceful restart of Redis (SIGTERM, same port and AOF)"
        self._probe(record, self._extraction_after(start), "an extraction completed")

    def _fault_redis_kill(self, record: FaultRecord) -> None:
        start = self.stack.extractions()
        killed = now_ms()
        kill_redis(self.stack.redis)
        if self.stack.config.appendfsync != "always":
            self.stack.loss_windows.append(LossWindow(killed - EVERYSEC_LOSS_WINDOW_MS, killed))
        self.stack.redis.start()
        record.detail = (
            f"kill -9 of Redis, restarted from its AOF ({self.stack.config.appendfsync})"
        )
        self._probe(record, self._extraction_after(start), "an extraction completed")

    def _fault_beat_kill(self, record: FaultRecord) -> None:
        index = self.stack.rng.randrange(len(self.stack.beats))
        victim = self.stack.beats[index]
        start = self.stack.extractions()
        victim.kill()
        self.stack.beats[index] = self.stack.procs.restart(victim)
        record.detail = f"kill -9 beat {victim.pid}, restarted as {self.stack.beats[index].pid}"
        self._probe(record, self._extraction_after(start), "an extraction completed")

    def _fault_forget(self, record: FaultRecord) -> None:
        candidates = sorted({c["user"] for c in self._conversations()} - self.stack.forgotten)
        chosen = self.stack.rng.sample(
            candidates, min(self.stack.config.forget_users, len(candidates))
        )
        wanted = self.stack.forgotten | set(chosen)
        (self.stack.control / "forget").write_text("\n".join(sorted(wanted)) + "\n")
        acked = wait_until(lambda: self._agents_stopped_for(wanted), DEADLINE_SECONDS)
        for user in chosen:
            self.stack.forget_method = forget_user(self.stack.settings, user)
        self.stack.forgotten |= set(chosen)
        record.detail = f"forgot {', '.join(chosen)} via {self.stack.forget_method}" + (
            "" if acked else " (an agent did not confirm it stopped for them)"
        )
        record.recovered_ms = now_ms()

    def _conversations(self) -> list[dict[str, Any]]:
        out: list[dict[str, Any]] = []
        for path in sorted(self.stack.control.glob("plan-*.json")):
            out.extend(json.loads(path.read_text(encoding="utf-8"))["conversations"])
        return out

    def _agents_stopped_for(self, users: set[str]) -> bool:
        for index in range(len(self.stack.agents)):
            path = self.stack.control / f"forget-ack-{index}"
            try:
                ack = json.loads(path.read_text(encoding="utf-8"))
            except (FileNotFoundError, ValueError):
                return False
            if not users <= set(ack["users"]) or ack["spool"]:
                return False
        return True

    def _probe(self, record: FaultRecord, condition: Callable[[], bool], what: str) -> None:
        """Measure recovery in the background (the next fault may be due before it)."""
        timeout = self.stack.config.lease_seconds * 10 + 120

        def watch() -> None:
            if wait_until(condition, timeout, interval=0.1):
                record.recovered_ms = now_ms()
                self.stack.say(
                    f"recovered from {record.fault.kind} in {record.recovery_seconds:.1f}s ({what})"
                )
            else:
                record.notes.append(f"not recovered within {timeout:g}s ({what})")
                self.stack.say(f"NOT recovered from {record.fault.kind} within {timeout:g}s")

        threading.Thread(target=watch, daemon=True).start()
