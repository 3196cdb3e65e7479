"""Runs the soak: the whole stack on loopback, steady load, a fault schedule, then the oracle."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

import redis

from bench.soak.chaos import FaultRunner
from bench.soak.collect import read_dead_letters, read_documents, read_turns
from bench.soak.faults import FaultRecord, schedule
from bench.soak.oracle import DocKey, LossWindow, OracleInput, StoredFact, Turn, Verdict, judge
from bench.soak.stack import SoakConfig, now_ms, running_stack
from memq.testing.redis_dump import dump_redis
from worker.queue import QueueClient

__all__ = ["SoakConfig", "SoakResult", "run_soak"]


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

    @property
    def faults_not_performed(self) -> list[FaultRecord]:
        return [r for r in self.faults if r.detail.startswith("FAILED")]

    @property
    def passed(self) -> bool:
        """The oracle found nothing, the queue drained, and every scheduled fault happened (a
        soak that skipped a fault proved less than it claims)."""
        return self.verdict.passed and self.drained and not self.faults_not_performed


def run_soak(config: SoakConfig) -> SoakResult:
    faults = schedule(config.duration_seconds, config.lease_seconds)
    records: list[FaultRecord] = []
    with running_stack(config) as stack:
        stack.say(
            f"load: {config.rate:g} turns/s over {config.threads} threads of {config.users} users "
            f"and {config.agents} agents by {config.producers} agents for {config.minutes:g} min; "
            f"{len(faults)} faults scheduled"
        )
        runner = FaultRunner(stack)
        begin = time.monotonic()
        stack.watch()
        for fault in faults:
            wait = begin + fault.at_seconds - time.monotonic()
            if wait > 0:
                time.sleep(wait)  # wait-ok: the fault schedule's clock
            try:
                records.append(runner.perform(fault))
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
                broker_keys=frozenset(
                    {"unacked", "unacked_index", "unacked_mutex", stack.settings.key_prefix}
                ),
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
