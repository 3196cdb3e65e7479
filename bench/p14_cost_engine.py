"""COST: what extraction costs, replayed through the real stack (producer, Redis, Celery worker
and beat, the real `openai` client) against the scripted provider's prefix cache and its files +
batches endpoints. The workload (``bench.cost_workload``): many users, each starting with a
memory of ~3,000 tokens (60 facts), then several sessions of a few turns, one thread per session.

Hand-over, as an agent does it: after each turn the producer's normal ``after_agent`` (debounced,
1 s here so the bench stays quick): a user's session goes quiet and becomes due. A flush only
where a real agent flushes — before summarisation drops messages: the last session of every
fourth user ends with one. The next round of sessions starts once every context of the last one
is settled (extracted, no run in flight, nothing parked for or out in a batch job).

Side by side, in one run, the same replay:
  (a) today's prompt before the cost engine (`MEMQ_LLM_PROMPT_LAYOUT=compact`): the instructions
      alone (1,045 tokens, just past the 1,024 a provider caches), then the memory's summaries,
      which change on every extraction, before its facts; no `prompt_cache_key`;
  (b) cache-friendly: the static part with its worked example first (byte-identical, ~1,600
      tokens), memory in a stable order, the hashed cache key per (user, agent);
  (c) (b) plus the batch lane (`MEMQ_LLM_BATCH_ENABLED`, gather and poll 0.5 s, the scripted
      jobs completing on their first poll after they start): sessions that went quiet go out in
      Batch API jobs, flushes stay synchronous. Batch answers report cached tokens like
      synchronous ones (the scripted provider caches batch requests' prefixes: OpenAI applies
      prompt caching to batch requests on its current models), and the worker's bill prices
      them at the batch discount;
  (d) (b) plus the memory slice (`MEMQ_MEMORY_SLICE_MAX_TOKENS=1000`, about a third of a
      seeded memory): the facts most relevant to the new messages, within 1,000 tokens.
Prompt tokens, cached share, LLM calls and $ per 1,000 turns (the worker's own bill); the item
facts each variant learnt are compared with (a)'s, and the missed duplicates counted: a turn of
each session restates a seeded fact in other words, which the scripted model (like a real one)
re-adds only when that fact is not in the prompt's memory.

Price tables ($ per million tokens, list prices at the time of writing; Batch and flex −50 %):
the headline is gpt-4.1-mini (input 0.40, cached input 0.10 — 25 % — output 1.60), the one the
bill is kept at; the same usage priced at gpt-4o-mini (input 0.15, cached input 0.075 — 50 % —
output 0.60) is printed beside it, computed from the recorded counters with the same price
function. With cached input at 50 %, a prompt that must add a cacheable static part cannot save
as much: read both.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from bench.common import BenchEnv, Result, celery_stack, llm_settings
from bench.cost_workload import (
    Workload,
    answer,
    learnt_items,
    missed_duplicates,
    seed_memories,
    session,
    user_id,
)
from memq.core.clock import now_ms
from memq.core.metrics import MetricsSnapshot, read_snapshot
from memq.testing.openai_server import ScriptedOpenAI
from memq.testing.provider import PrefixCache, Provider
from memq.testing.waiting import wait_for
from producer.producer import MemoryProducer
from storage import get_storage
from worker.batch_queue import BatchQueue
from worker.cost import CallUsage, PriceTable
from worker.queue import QueueClient

# $ per million tokens: input, cached input, output; the first is the headline the bill is kept at.
PRICE_TABLES = {
    "gpt-4.1-mini": PriceTable(0.40, 0.10, 1.60, batch_discount=0.5),
    "gpt-4o-mini": PriceTable(0.15, 0.075, 0.60, batch_discount=0.5),
}
HEADLINE = "gpt-4.1-mini"
SLICE_TOKENS = 1000
BATCH = {
    "llm_batch_enabled": True,
    "llm_batch_gather_seconds": 0.5,
    "llm_batch_poll_seconds": 0.5,
}
VARIANTS: dict[str, dict[str, Any]] = {
    "(a) today's prompt": {"llm_prompt_layout": "compact", "llm_prompt_cache_key": False},
    "(b) cache-friendly": {},
    "(c) (b) + batch lane": BATCH,
    f"(d) (b) + memory slice {SLICE_TOKENS:,}": {"memory_slice_max_tokens": SLICE_TOKENS},
}
BASE, CACHED, BATCHED, SLICED = VARIANTS


def price_settings(table: PriceTable) -> dict[str, float]:
    return {
        "llm_price_input_per_million": table.input_per_million,
        "llm_price_cached_input_per_million": table.cached_input_per_million,
        "llm_price_output_per_million": table.output_per_million,
        "llm_batch_discount": table.batch_discount,
    }


def flushes(user: int, number: int, workload: Workload) -> bool:
    """Summarisation ends the last session of every fourth user: the agent flushes it."""
    return number == workload.sessions - 1 and user % 4 == 0


@dataclass(frozen=True)
class Outcome:
    metrics: MetricsSnapshot
    sync_calls: int
    batch_requests: int
    items: dict[str, list[str]]
    duplicates: int

    @property
    def prompt(self) -> int:
        return self.metrics["prompt_tokens"] + self.metrics["batch_prompt_tokens"]

    @property
    def cached(self) -> int:
        return self.metrics["cached_tokens"] + self.metrics["batch_cached_tokens"]

    @property
    def share(self) -> float:
        return self.cached / self.prompt if self.prompt else 0.0

    def per_1000(self, table: PriceTable) -> float:
        """$ per 1,000 turns at ``table``, from the recorded usage of each lane."""
        m = self.metrics
        turns = m["turns_extracted"]
        if not turns:
            return 0.0
        sync = CallUsage(m["prompt_tokens"], m["cached_tokens"], m["completion_tokens"])
        batch = CallUsage(
            m["batch_prompt_tokens"],
            m["batch_cached_tokens"],
            m["batch_completion_tokens"],
            "batch",
        )
        return (table.cost_usd(sync) + table.cost_usd(batch)) * 1000 / turns


def settled(queue: QueueClient, batches: BatchQueue, messages: int) -> bool:
    """Every message handed over so far extracted, nothing in flight, parked or out."""
    snapshot = read_snapshot(queue.redis, queue.settings, now_ms())
    if snapshot.metrics["turns_extracted"] < messages:
        return False
    stats = queue.stats()
    return stats["due"] == 0 and stats["inflight"] == 0 and not any(batches.depths().values())


def wait_settled(queue: QueueClient, batches: BatchQueue, messages: int, what: str) -> None:
    wait_for(lambda: settled(queue, batches, messages), timeout=180, interval=0.1, what=what)


def one_variant(env: BenchEnv, overrides: dict[str, Any], workload: Workload) -> Outcome:
    server = ScriptedOpenAI(answer, provider=Provider(cache=PrefixCache())).start()
    server.batches.auto_complete = True
    try:
        settings = llm_settings(
            env,
            server,
            tick_seconds=0.2,
            debounce_seconds=1.0,
            max_delay_seconds=10.0,
            token_counting=True,
            **price_settings(PRICE_TABLES[HEADLINE]),
            **overrides,
        )
        client = env.client()
        queue = QueueClient(settings, client)
        batches = BatchQueue(settings, client)
        seed_memories(settings, client, workload.users)
        handed = 0
        with celery_stack(env, settings, workers=1, concurrency=4), MemoryProducer(settings) as p:
            for number in range(workload.sessions):
                for user in range(workload.users):
                    messages = session(user, number, workload.turns)
                    for end in range(2, len(messages) + 1, 2):  # after each turn
                        if not p.after_agent(f"s{number}", user_id(user), None, messages[:end]):
                            raise RuntimeError("a turn was not enqueued")
                    if flushes(user, number, workload) and not p.flush(
                        f"s{number}", user_id(user), None, messages
                    ):
                        raise RuntimeError("a flush was not enqueued")
                    handed += len(messages)
                wait_settled(queue, batches, handed, f"session {number} of every user settled")
        metrics = read_snapshot(client, settings, now_ms()).metrics
        storage = get_storage(settings, redis=client)
        documents = {u: storage.load(user_id(u), None) for u in range(workload.users)}
        client.close()
    finally:
        server.stop()
    return Outcome(
        metrics=metrics,
        sync_calls=server.call_count,
        batch_requests=len(server.batches.answered),
        items={user_id(u): learnt_items(d) for u, d in documents.items()},
        duplicates=sum(missed_duplicates(d, u) for u, d in documents.items()),
    )


def run(env: BenchEnv) -> Result:
    workload = Workload(6, 3, 3) if env.quick else Workload(20, 4, 3)
    results = {name: one_variant(env, o, workload) for name, o in VARIANTS.items()}
    base = results[BASE]
    headline = PRICE_TABLES[HEADLINE]

    def cost(name: str, table: PriceTable = headline) -> float:
        """$ per 1,000 turns: the worker's bill at the headline prices, else the recorded usage
        priced at ``table``."""
        r = results[name]
        return (
            (r.metrics.cost_per_1000_turns_usd or 0.0) if table is headline else r.per_1000(table)
        )

    def ratio(name: str, table: PriceTable = headline) -> float:
        return cost(name, table) / cost(BASE, table)

    # The other price table is applied to the counters: they must give the bill back at the
    # headline prices (to the nano-dollar rounding of each call), else that figure is not trusted.
    agree = all(
        abs(r.per_1000(headline) - cost(name)) <= 0.001 * cost(name) for name, r in results.items()
    )
    rows = []
    for name, r in results.items():
        bill = cost(name)
        rows.append(
            f"{name}: {r.prompt} prompt tokens, {r.share:.0%} cached, {r.sync_calls} LLM calls "
            f"+ {r.batch_requests} batch requests, ${bill:.4f} per 1,000 turns at {HEADLINE} "
            f"({ratio(name):.0%} of (a)), {r.duplicates} missed duplicates, facts "
            f"{'same as' if r.items == base.items else 'DIFFERENT from'} (a)"
        )
        for other, table in PRICE_TABLES.items():
            if other != HEADLINE:
                rows.append(
                    f"{name} at {other}: ${cost(name, table):.4f} per 1,000 turns "
                    f"({ratio(name, table):.0%} of (a) at {other})"
                )
    b, c, d = results[CACHED], results[BATCHED], results[SLICED]
    if not agree:
        rows.append("the recorded usage does not give the bill back: the other prices are off")
    met = (
        agree
        and b.share >= 0.5
        and ratio(CACHED) <= 0.70
        and ratio(BATCHED) <= 0.45
        and all(r.items == base.items for r in results.values())
        and base.duplicates == b.duplicates == c.duplicates == 0
    )
    others = "; ".join(
        f"at {other}: (b) {ratio(CACHED, t):.0%}, (c) {ratio(BATCHED, t):.0%}, "
        f"(d) {ratio(SLICED, t):.0%} of (a)"
        for other, t in PRICE_TABLES.items()
        if other != HEADLINE
    )
    return Result(
        key="COST",
        title=f"extraction cost, {workload.users} users x {workload.sessions} sessions x "
        f"{workload.turns} turns, at {HEADLINE} prices",
        measured=f"(b) {b.share:.0%} cached, {ratio(CACHED):.0%} of (a)'s cost; "
        f"(c) {ratio(BATCHED):.0%}; (d) {ratio(SLICED):.0%}, {d.duplicates} missed duplicates",
        baseline=f"(a) today's prompt ${base.metrics.cost_per_1000_turns_usd or 0.0:.4f} "
        "per 1,000 turns",
        goal="(b) >= 50 % cached and <= 70 % of (a); (c) <= 45 % of (a); same facts, "
        "0 missed duplicates in (a)-(c)",
        met=met,
        details=rows,
        note=f"headline prices {HEADLINE} (cached input 25 % of input), {others} "
        "(cached input 50 %); batch tokens at the bill's batch discount, their cached part "
        "included; (d) is measured, not a goal",
    )
