"""Burst merge: ten turns of one thread inside the debounce window become how many LLM calls?
Real beat + worker + scripted LLM.

No baseline ratio: DeerFlow's own memory queue already coalesces the updates of one thread within
its debounce window, so "one call per turn" would be a baseline nobody runs. The figure is judged
against its goal only (one call, holding the last turn)."""

from __future__ import annotations

from bench.common import BenchEnv, Result, celery_stack, llm_settings, scripted_llm
from memq.testing.waiting import wait_for
from producer.producer import MemoryProducer
from worker.queue import QueueClient

TURNS = 10


def run(env: BenchEnv) -> Result:
    with scripted_llm() as server:
        settings = llm_settings(
            env, server, tick_seconds=0.2, debounce_seconds=2.0, max_delay_seconds=30.0
        )
        client = env.client()
        queue = QueueClient(settings, client)
        try:
            with (
                celery_stack(env, settings, concurrency=2) as procs,
                MemoryProducer(settings) as producer,
            ):
                messages: list[dict[str, str]] = []
                for turn in range(TURNS):
                    messages += [
                        {"role": "user", "content": f"Turn {turn}: I deploy billing on Fridays."},
                        {"role": "assistant", "content": f"Noted for turn {turn}."},
                    ]
                    if not producer.after_agent("burst-thread", "alice", None, list(messages)):
                        raise RuntimeError("after_agent was not enqueued")

                def settled() -> bool:
                    stats: dict[str, int] = queue.stats()
                    return server.call_count >= 1 and stats["due"] == 0 and stats["inflight"] == 0

                try:
                    wait_for(settled, timeout=60, what="the burst to be extracted")
                except AssertionError as exc:
                    raise RuntimeError(
                        f"{exc}: {server.call_count} LLM calls, queue {queue.stats()}\n"
                        + procs.logs()[-3000:]
                    ) from exc
        finally:
            client.close()
        calls = server.call_count
        last_prompt = server.prompts()[-1]
    complete = f"Turn {TURNS - 1}:" in last_prompt
    return Result(
        key="Burst",
        title=f"burst merge: {TURNS} turns inside the debounce window",
        measured=f"{calls} LLM call(s)"
        + ("" if complete else " — the last turn was NOT in the prompt"),
        baseline="none: DeerFlow's queue also coalesces per thread (no per-turn peer to beat)",
        goal="1 LLM call",
        met=calls == 1 and complete,
        details=[f"debounce {settings.debounce_seconds:.0f} s, tick {settings.tick_seconds} s"],
    )
