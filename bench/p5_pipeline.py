"""P5: the pipeline's own CPU time per extraction — prompt, parse, apply, save on disk — with a
model that answers instantly. Baseline: the file storage's load + atomic update alone (the I/O
floor every extraction pays)."""

from __future__ import annotations

import json
import time

from bench.common import BenchEnv, Result, percentile
from memq.core.identity import ContextKey
from memq.core.models import ConversationContext, Message
from storage import get_storage
from storage.base import UpdateResult
from storage.document import MemoryDocument
from worker.model import ModelAnswer
from worker.pipeline import ExtractionPipeline

USERS = 50


class InstantModel:
    """An UpdateModel that returns a canned answer (two new facts) without any I/O."""

    def __init__(self) -> None:
        self.calls = 0

    def propose(self, prompt: object, *, cache_key: str | None = None) -> ModelAnswer:
        self.calls += 1
        n = self.calls
        answer = {
            "user": {"topOfMind": {"summary": f"Billing, step {n}.", "shouldUpdate": True}},
            "history": {},
            "newFacts": [
                {"content": f"User prefers Go for service {n}", "category": "preference",
                 "confidence": 0.9},
                {"content": f"User deploys release {n} on Fridays", "category": "behavior",
                 "confidence": 0.8},
            ],
            "factsToRemove": [],
        }  # fmt: skip
        return ModelAnswer(json.dumps(answer), prompt_tokens=1000, completion_tokens=80, model="x")

    def close(self) -> None:
        return None


def context(index: int) -> ConversationContext:
    messages = []
    for turn in range(5):
        messages.append(Message("user", f"Turn {turn}: I run the billing service in Go. " * 5))
        messages.append(Message("assistant", f"Answer {turn}: keep handlers small. " * 5))
    key = ContextKey.create(f"thread-{index}", f"user-{index % USERS}", "bench")
    return ConversationContext(key=key, messages=tuple(messages))


def run(env: BenchEnv) -> Result:
    settings = env.settings(storage="file")
    storage = get_storage(settings)
    pipeline = ExtractionPipeline(settings, storage, InstantModel())
    rounds = 200 if env.quick else 1000
    contexts = [context(i) for i in range(rounds + USERS)]
    for warm in contexts[:USERS]:  # tiktoken, the folders, one document per user
        pipeline.run(warm)
    cpu: list[float] = []
    wall: list[float] = []
    io_cpu: list[float] = []

    def identity(document: MemoryDocument) -> UpdateResult:
        return UpdateResult(document, [])

    for ctx in contexts[USERS:]:
        c0, w0 = time.process_time(), time.perf_counter()
        report = pipeline.run(ctx)
        cpu.append(time.process_time() - c0)
        wall.append(time.perf_counter() - w0)
        if report.outcome != "updated":
            raise RuntimeError(f"extraction did not update: {report}")
        c0 = time.process_time()
        storage.load(ctx.user_id, ctx.agent_name)
        storage.update(ctx.user_id, ctx.agent_name, identity)
        io_cpu.append(time.process_time() - c0)
    # process_time ticks coarsely on some kernels: the mean is the honest per-run figure.
    mean_cpu = sum(cpu) / len(cpu)
    mean_io = sum(io_cpu) / len(io_cpu)
    facts = len(storage.load("user-0", "bench").facts)
    return Result(
        key="P5",
        title="pipeline CPU per extraction (instant LLM, file storage)",
        measured=f"{mean_cpu * 1000:.2f} ms CPU mean "
        f"(wall p50 {percentile(wall, 50) * 1000:.2f} ms)",
        baseline=f"storage load + update alone {mean_io * 1000:.2f} ms CPU; "
        f"ratio {mean_cpu / mean_io:.1f}x",
        goal="<= 3 ms CPU",
        met=mean_cpu <= 0.003,
        details=[f"{rounds} extractions over {USERS} users; documents end at ~{facts} facts"],
    )
