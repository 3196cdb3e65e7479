"""P5: the pipeline's own CPU time per extraction — prompt, parse, apply, save on disk — with a
model that answers instantly. Baseline: the file storage's load + atomic update alone (the I/O
floor every extraction pays)."""

from __future__ import annotations

import re
import time

from bench.common import BenchEnv, Result, percentile
from bench.guard import Ratio
from memq.core.identity import ContextKey
from memq.core.models import ConversationContext, Message
from memq.core.settings import MemqSettings
from memq.memory.update import NewFact, SectionUpdate, UpdateAnswer
from memq.testing.openai_server import update_text
from prompts.tokens import make_token_counter
from prompts.update_prompt import build_update_prompt
from storage import get_storage
from storage.base import UpdateResult
from storage.document import MemoryDocument, utc_now
from storage.history import dump_document
from worker.model import ModelAnswer
from worker.pipeline import ExtractionPipeline

USERS = 50


class InstantModel:
    """An UpdateModel that returns a canned answer (two new facts) without any I/O: one cites
    the message it comes from, one cites nothing (so its source is the whole run)."""

    def __init__(self) -> None:
        self.calls = 0

    def propose(self, prompt: object, *, cache_key: str | None = None) -> ModelAnswer:
        self.calls += 1
        n = self.calls
        summary = SectionUpdate(summary=f"Billing, step {n}.", should_update=True)
        answer = UpdateAnswer(
            sections={"top_of_mind": summary},
            new_facts=(
                NewFact(content=f"User prefers Go for service {n}", category="preference",
                        confidence=0.9, cites=("m1",)),
                NewFact(content=f"User deploys release {n} on Fridays", category="behavior",
                        confidence=0.8),
            ),
        )  # fmt: skip
        text = update_text(answer)
        return ModelAnswer(text, prompt_tokens=1000, completion_tokens=80, model="x")

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
    document = storage.load("user-0", "bench")
    facts = len(document.facts)
    sizes = provenance_sizes(document, contexts[0], settings)
    return Result(
        key="P5",
        title="pipeline CPU per extraction (instant LLM, file storage)",
        measured=f"{mean_cpu * 1000:.2f} ms CPU mean "
        f"(wall p50 {percentile(wall, 50) * 1000:.2f} ms)",
        baseline=f"storage load + update alone {mean_io * 1000:.2f} ms CPU; "
        f"ratio {mean_cpu / mean_io:.1f}x",
        goal="<= 3 ms CPU",
        met=mean_cpu <= 0.003,
        ratios={"pipeline CPU vs storage floor": Ratio(mean_cpu / mean_io, "lower")},
        details=[
            f"{rounds} extractions over {USERS} users; documents end at ~{facts} facts",
            *sizes,
        ],
    )


def provenance_sizes(
    document: MemoryDocument, ctx: ConversationContext, settings: MemqSettings
) -> list[str]:
    """What provenance costs, before/after side by side, measured in this run: document bytes per
    fact (the same document without sources, confirmations and superseded facts = before), and
    prompt tokens per extraction with tiktoken (the same prompt without the message labels, the
    citation paragraph and the ``cites`` example of the schema = before, which is byte for byte
    the prompt this change started from)."""
    after_bytes = len(dump_document(document).encode())
    stripped = document.model_copy(
        update={
            "facts": [f.model_copy(update={"sources": []}) for f in document.facts],
            "superseded": [],
        }
    )
    before_text = stripped.model_dump_json(
        indent=2, exclude={"superseded": True, "facts": {"__all__": {"sources", "confirmations"}}}
    )
    before_bytes = len((before_text + "\n").encode())
    count = make_token_counter(True)
    prompt = build_update_prompt(
        document, ctx.messages, settings=settings, now=utc_now(), count_tokens=count
    )
    if prompt is None:
        return []
    after_tokens = count(prompt.system + prompt.user)
    # The citation instruction is one line of the fact rules (the prompt's rule for "cites").
    system = re.sub(r'^- "cites": .*\n', "", prompt.system, count=1, flags=re.MULTILINE)
    system = system.replace(', "cites": ["m1"]', "")
    user = re.sub(r"^\[m\d+\] ", "", prompt.user, flags=re.MULTILINE)
    before_tokens = count(system + user)
    n = max(len(document.facts), 1)
    return [
        f"document bytes per fact: before {before_bytes / n:.0f} | after {after_bytes / n:.0f} "
        f"({after_bytes / max(before_bytes, 1):.2f}x; {n} facts, one source each: half cite one "
        f"message, half are run-level over the run's {len(ctx.messages)} messages)",
        f"prompt tokens per extraction: before {before_tokens} | after {after_tokens} "
        f"(+{after_tokens - before_tokens}; {len(prompt.conversation)} messages labelled)",
    ]
