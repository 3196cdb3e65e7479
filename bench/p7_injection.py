"""P7: formatting 200 facts into a 2,000-token budget with tiktoken, the way MemoryInjector does
before every agent turn. Baseline: tiktoken encoding the whole unbudgeted fact list once."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

from bench.common import BenchEnv, Result, fmt_ms, percentile
from bench.guard import Ratio, band_of
from prompts.injection import format_memory_for_injection, render_fact
from prompts.tokens import make_token_counter
from storage.document import Fact, MemoryDocument
from storage.sections import Section
from storage.vocabulary import CATEGORIES

TOPICS = (
    "prefers Go with table-driven tests",
    "deploys billing on Kubernetes 1.29 with Helm",
    "writes documentation in British English",
    "uses uv instead of pip for Python projects",
    "works in the Berlin office, CET time zone",
    "is learning Rust ownership and lifetimes",
)


def memory_with_facts(count: int = 200) -> MemoryDocument:
    start = datetime(2025, 1, 1, tzinfo=UTC)
    facts = [
        Fact(
            id=f"fact-{i}",
            content=f"User {TOPICS[i % len(TOPICS)]} (note {i}, project p{i % 17}).",
            category=CATEGORIES[i % len(CATEGORIES)],
            confidence=0.7 + (i % 30) / 100,
            created_at=start + timedelta(hours=i),
            source_error="suggested pip"
            if CATEGORIES[i % len(CATEGORIES)] == "correction"
            else None,
        )
        for i in range(count)
    ]
    document = MemoryDocument(facts=facts)
    document.user.work_context = Section(summary="Backend engineer on the billing team. " * 3)
    document.user.top_of_mind = Section(summary="Migrating billing to Go; Rust on the side. " * 3)
    document.history.recent_months = Section(summary="Shipped the invoice service rewrite. " * 4)
    return document


def run(env: BenchEnv) -> Result:
    memory = memory_with_facts()
    count = make_token_counter(True)
    rounds = 100 if env.quick else 400
    samples: list[float] = []
    base: list[float] = []
    text = ""
    whole = "\n".join(render_fact(f) for f in memory.facts)
    for _ in range(10):  # warm-up
        format_memory_for_injection(memory, 2000, count_tokens=count)
    for _ in range(rounds):
        t0 = time.perf_counter()
        text = format_memory_for_injection(memory, 2000, count_tokens=count)
        samples.append(time.perf_counter() - t0)
        fresh = make_token_counter(True)  # its own empty cache: one real tiktoken pass
        t0 = time.perf_counter()
        fresh(whole)
        base.append(time.perf_counter() - t0)
    median = percentile(samples, 50)
    base_median = percentile(base, 50)
    ratio = median / base_median
    per_round = [a / b for a, b in zip(samples, base, strict=True)]
    return Result(
        key="P7",
        title="injection: 200 facts into 2,000 tokens (tiktoken)",
        measured=f"median {fmt_ms(median)}, p99 {fmt_ms(percentile(samples, 99))}",
        baseline=f"one tiktoken pass over all 200 facts {fmt_ms(base_median)}; ratio {ratio:.2f}x",
        goal="<= 0.5x one tiktoken pass over the facts (median)",
        met=ratio <= 0.5,
        ratios={"inject vs one tiktoken pass": Ratio(ratio, "lower", band_of(per_round))},
        details=[
            f"output {count(text)} tokens, {text.count(chr(10) + '- [')} facts kept",
            "the injector's counter and the rendered fact lines are kept between calls (both "
            "bounded), as in an agent's process; the baseline counts with an empty cache",
        ],
    )
