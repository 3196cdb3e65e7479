"""The queue's figures as labelled rows, in one order and one wording, for every door that shows
them to a person (`memq stats`, the inspector's queue page)."""

from __future__ import annotations

from typing import Any


def stats_rows(stats: dict[str, Any]) -> list[tuple[str, object]]:
    """The table: current depths first, then totals since the counters began."""
    from memq.core.metrics import BATCH_DEPTHS, COUNTERS

    tick_age = stats["last_tick_age_ms"]
    rows: list[tuple[str, object]] = [
        ("due", stats["due"]),
        ("in flight", stats["inflight"]),
        ("dead letters now", stats["dead"]),
        *((depth.text, stats[depth.name]) for depth in BATCH_DEPTHS),
        ("oldest deadline lag", f"{stats['oldest_due_lag_ms'] / 1000:.1f} s"),
        ("last tick", "never" if tick_age is None else f"{max(tick_age, 0) / 1000:.1f} s ago"),
    ]
    if len(stats["shards"]) > 1:
        rows += [
            (
                f"shard {s['shard']}",
                f"due {s['due']}, in flight {s['inflight']}, dead {s['dead']}, "
                f"lag {s['oldest_due_lag_ms'] / 1000:.1f} s",
            )
            for s in stats["shards"]
        ]
    names = {"retry": "retry scheduled", "dead": "dead-lettered"}
    rows += [
        (f"extractions: {names.get(outcome, outcome)}", count)
        for outcome, count in stats["extractions"].items()
    ]
    rows.append(
        ("dead-lettered in total (failed runs + expired leases)", stats["dead_lettered_total"])
    )
    rows += [(f"LLM requests: {result}", n) for result, n in stats["llm_requests"].items()]
    rows += [
        (f"runs deferred before the call: {reason.replace('_', ' ')}", n)
        for reason, n in stats["deferred"].items()
    ]
    if stats["llm_latency_mean_seconds"] is not None:
        rows.append(("LLM latency, mean", f"{stats['llm_latency_mean_seconds']:.2f} s"))
    shown = {
        "cached_tokens": _with_share(stats["cached_tokens"], stats["cached_share"]),
        "cost_nano_usd": _dollars(stats["llm_cost_usd"]),
    }
    rows += [(counter.text, shown.get(counter.field, stats[counter.field])) for counter in COUNTERS]
    rows += [
        ("LLM cost per extraction", _dollars(stats["cost_per_extraction_usd"])),
        ("LLM cost per 1,000 turns", _dollars(stats["cost_per_1000_turns_usd"])),
    ]
    return rows


def _with_share(count: int, share: float | None) -> str:
    return str(count) if share is None else f"{count} ({share:.0%})"


def _dollars(amount: float | None) -> str:
    """Dollars to a tenth of a micro-dollar, enough for one cheap call; "-" before any."""
    return "-" if amount is None else f"${amount:.6f}"
