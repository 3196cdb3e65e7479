"""HOSTILE: ``MemoryProducer.after_agent`` on a 200 KB hostile user message (unclosed openers of
every stripped block, nested and mixed-case tags, stray closers) and on the same message at 4x,
interleaved in one run: stripping blocks must be linear (4x the input costs <= 5x the time).
Baseline: the same call on an ordinary 200 KB message without a tag.

The size cap is raised for this benchmark, so the 4x message is scanned whole (with the default
``MEMQ_PRODUCER_MAX_CHARS`` it would be cut to 200,000 characters before any pattern runs).
"""

from __future__ import annotations

import time
from typing import Any

from bench.common import BenchEnv, Result, fmt_ms, percentile
from bench.guard import Ratio
from producer.producer import MemoryProducer

# Openers never closed, a nested pair, tags of other names inside, a stray closer, mixed case.
HOSTILE_PIECES = (
    "<uploaded_files>",
    "<current_uploads>- a.pdf",
    "<MEMORY><memory>x</memory>",
    "<user_memory>",
    "</current_uploads>",
    "<Uploaded_Files>",
    " a < b ",
)
SIZE = 200_000


def hostile(size: int) -> str:
    text = "I work on billing at Acme. "
    unit = "".join(HOSTILE_PIECES)
    return (text + unit * (size // len(unit) + 1))[:size]


def plain(size: int) -> str:
    unit = "I work on the billing service in Go and prefer short answers. "
    return (unit * (size // len(unit) + 1))[:size]


def dialogue(user: str) -> list[dict[str, Any]]:
    return [{"role": "user", "content": user}, {"role": "assistant", "content": "Noted."}]


def run(env: BenchEnv) -> Result:
    settings = env.settings(
        debounce_seconds=30,
        producer_timeout_seconds=5.0,
        producer_max_chars=5 * SIZE,
        pending_max_bytes=40 * SIZE,
        context_max_bytes=40 * SIZE,  # the hard cap must hold what the pending cap lets through
    )
    rounds = 5 if env.quick else 15
    messages = {
        "1x": dialogue(hostile(SIZE)),
        "4x": dialogue(hostile(4 * SIZE)),
        "plain": dialogue(plain(SIZE)),
    }
    samples: dict[str, list[float]] = {name: [] for name in messages}
    with MemoryProducer(settings) as producer:
        for name, raw in messages.items():  # warm-up (script load, first connection)
            producer.after_agent(f"warm-{name}", "alice", "bench", raw)
        for i in range(rounds):
            for name, raw in messages.items():
                t0 = time.perf_counter()
                producer.after_agent(f"{name}-{i}", "alice", "bench", raw)
                samples[name].append(time.perf_counter() - t0)
        errors = producer.stats.errors
    one, four, base = (percentile(samples[n], 50) for n in ("1x", "4x", "plain"))
    ratio = four / one
    return Result(
        key="HOSTILE",
        title="after_agent on a 200 KB hostile message, and at 4x",
        measured=f"1x median {fmt_ms(one)}, 4x median {fmt_ms(four)}; 4x/1x = {ratio:.1f}",
        baseline=f"ordinary 200 KB message {fmt_ms(base)}; hostile/ordinary {one / base:.1f}x",
        goal="4x the input <= 5x the time",
        met=ratio <= 5.0 and errors == 0,
        ratios={"4x input vs 1x time": Ratio(ratio, "lower")},
        details=[
            f"{rounds} interleaved rounds each; p99 1x {fmt_ms(percentile(samples['1x'], 99))}, "
            f"4x {fmt_ms(percentile(samples['4x'], 99))}",
            "before the linear scan, 128,000 characters of unclosed openers took 13 s",
        ],
    )
