"""COST: what extraction costs, replayed through the real stack (producer, Redis, Celery worker
and beat, the real `openai` client) against the scripted provider's prefix cache: many users,
each starting with a memory of ~3,000 tokens (60 facts, the size the issue measured on LoCoMo),
then several sessions of several turns, one flush per session, sessions in order.

Side by side, in one run:
  (a) today's prompt before the cost engine (`MEMQ_LLM_PROMPT_LAYOUT=compact`): the instructions
      alone (959 tokens, under the 1,024 a provider caches), the memory's summaries before its
      facts, no `prompt_cache_key`;
  (b) cache-friendly: the static part with its worked example first (byte-identical, ~1,470
      tokens), memory in a stable order, the hashed cache key per (user, agent);
  (c) (b) at the flex tier (batch prices, synchronous) — the batch lane (merged beside this
      bench) is not wired into it yet, so this is the discount it would give, not a measurement.
Prompt tokens, cached share, LLM calls and $ per 1,000 turns at the example price table below;
the facts each variant extracted are compared with (a)'s (the scripted answers are the same).

Example price table (gpt-4o-mini list prices at the time of writing, $ per million tokens):
input 0.15, cached input 0.075, output 0.60; flex/batch discount 50 %.
"""

from __future__ import annotations

import json
import re
from typing import Any

from bench.common import BenchEnv, Result, celery_stack, llm_settings
from memq.core.metrics import read_snapshot
from memq.testing.openai_server import Reply, ScriptedOpenAI
from memq.testing.provider import PrefixCache, Provider
from memq.testing.waiting import wait_for
from producer.producer import MemoryProducer
from storage import get_storage
from storage.document import Fact, MemoryDocument
from worker.queue import QueueClient, now_ms

PRICES = {
    "llm_price_input_per_million": 0.15,
    "llm_price_cached_input_per_million": 0.075,
    "llm_price_output_per_million": 0.60,
    "llm_batch_discount": 0.5,
}
VARIANTS: dict[str, dict[str, Any]] = {
    "(a) today's prompt": {"llm_prompt_layout": "compact", "llm_prompt_cache_key": False},
    "(b) cache-friendly": {},
    "(c) (b) + flex tier": {"llm_service_tier": "flex"},
}
ITEM = re.compile(r"item-\d+-\d+-\d+")


def answer(request: dict[str, Any]) -> Reply:
    """One fact per item the new conversation mentions (never the memory's)."""
    text = str(request["messages"][-1]["content"]).split("<conversation>")[-1]
    items = sorted(set(ITEM.findall(text)))
    facts = [
        {"content": f"The user owns {i}", "category": "context", "confidence": 0.9} for i in items
    ]
    # As real models do, the summary of what the user is focused on now is rewritten each time.
    focus = f"Currently thinking about {', '.join(items) or 'nothing new'}."
    body = {
        "user": {"topOfMind": {"summary": focus, "shouldUpdate": True}},
        "history": {},
        "newFacts": facts,
        "factsToRemove": [],
    }
    return Reply(content=json.dumps(body), completion_tokens=60 + 25 * len(items))


def session(user: int, number: int, turns: int) -> list[dict[str, str]]:
    messages = []
    for turn in range(turns):
        item = f"item-{user}-{number}-{turn}"
        messages.append(
            {
                "role": "user",
                "content": f"Session {number}, turn {turn}: I just bought {item}; it is a "
                "second-hand road bike with a carbon frame and I plan to ride it to work "
                "three days a week, so please remember it.",
            }
        )
        messages.append({"role": "assistant", "content": f"Noted: you own {item}. Enjoy it!"})
    return messages


SEEDED_FACTS = 60  # ~3,000 tokens of memory per user, as on LoCoMo's real conversations


def seed_memories(settings: Any, client: Any, users: int) -> None:
    """Each user starts with a memory of the size the issue measured (3,300-4,400 tokens)."""
    storage = get_storage(settings, redis=client)
    for user in range(users):
        facts = [
            Fact(
                content=f"User {user} fact {n}: prefers {n % 7 + 2}-space indentation in "
                f"project p{n} and reviews pull requests every {n % 5 + 1} days before standup",
                confidence=0.9,
            )
            for n in range(SEEDED_FACTS)
        ]
        storage.save(f"user-{user}", None, MemoryDocument(facts=facts))


def one_variant(
    env: BenchEnv, overrides: dict[str, Any], users: int, sessions: int, turns: int
) -> dict[str, Any]:
    server = ScriptedOpenAI(answer, provider=Provider(cache=PrefixCache())).start()
    try:
        settings = llm_settings(
            env,
            server,
            tick_seconds=0.2,
            debounce_seconds=30.0,
            max_delay_seconds=300.0,
            token_counting=True,
            **PRICES,
            **overrides,
        )
        client = env.client()
        queue = QueueClient(settings, client)

        def idle() -> bool:
            stats: dict[str, int] = queue.stats()
            return stats["due"] == 0 and stats["inflight"] == 0

        seed_memories(settings, client, users)
        with celery_stack(env, settings, workers=1, concurrency=4), MemoryProducer(settings) as p:
            for number in range(sessions):
                for user in range(users):
                    if not p.flush(
                        f"s{number}", f"user-{user}", None, session(user, number, turns)
                    ):
                        raise RuntimeError("flush was not enqueued")
                wait_for(idle, timeout=120, interval=0.05)
        snapshot = read_snapshot(client, settings, now_ms()).metrics
        storage = get_storage(settings, redis=client)
        facts = {
            f"user-{u}": sorted(
                f.content for f in storage.load(f"user-{u}", None).facts if "item-" in f.content
            )
            for u in range(users)
        }
        client.close()
    finally:
        server.stop()
    return {
        "prompt": snapshot["prompt_tokens"],
        "cached": snapshot["cached_tokens"],
        "calls": server.call_count,
        "per_1000": snapshot.cost_per_1000_turns_usd or 0.0,
        "facts": facts,
    }


def run(env: BenchEnv) -> Result:
    users, sessions, turns = (6, 3, 3) if env.quick else (20, 4, 3)
    results = {name: one_variant(env, o, users, sessions, turns) for name, o in VARIANTS.items()}
    base = results["(a) today's prompt"]
    rows = []
    for name, r in results.items():
        share = r["cached"] / r["prompt"] if r["prompt"] else 0.0
        rows.append(
            f"{name}: {r['prompt']} prompt tokens, {share:.0%} cached, {r['calls']} LLM calls, "
            f"${r['per_1000']:.4f} per 1,000 turns "
            f"({r['per_1000'] / base['per_1000']:.0%} of (a)), "
            f"facts {'same as' if r['facts'] == base['facts'] else 'DIFFERENT from'} (a)"
        )
    b, c = results["(b) cache-friendly"], results["(c) (b) + flex tier"]
    b_share = b["cached"] / b["prompt"] if b["prompt"] else 0.0
    met = (
        b_share >= 0.5
        and b["per_1000"] <= 0.70 * base["per_1000"]
        and c["per_1000"] <= 0.45 * base["per_1000"]
        and all(r["facts"] == base["facts"] for r in results.values())
    )
    return Result(
        key="COST",
        title=f"extraction cost, {users} users x {sessions} sessions x {turns} turns",
        measured=f"(b) {b_share:.0%} cached, {b['per_1000'] / base['per_1000']:.0%} of (a)'s cost; "
        f"(c) {c['per_1000'] / base['per_1000']:.0%}",
        baseline=f"(a) today's prompt ${base['per_1000']:.4f} per 1,000 turns",
        goal="(b) >= 50 % cached and <= 70 % of (a); (c) <= 45 % of (a); same facts",
        met=met,
        details=rows,
        note="(c) is the flex tier's discount; the batch lane is not wired into COST yet",
    )
