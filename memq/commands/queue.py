"""`memq enqueue`, `memq stats`, `memq dead`: the queue, seen and repaired from a shell."""

from __future__ import annotations

import argparse
from dataclasses import asdict
from datetime import UTC, datetime
from typing import TYPE_CHECKING, Any

from memq.commands.common import (
    CommandContext,
    CommandError,
    add_user_argument,
    format_table,
    print_json,
    read_json_file,
    shown,
)

if TYPE_CHECKING:
    from worker.metrics import MetricsSnapshot, ShardGauges


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    enqueue = sub.add_parser(
        "enqueue",
        help="enqueue a conversation from a JSON file",
        description=(
            "Enqueue a JSON file of messages (a list of {role, content} objects, or an object "
            "with a `messages` list) as one turn of a thread, exactly as an agent's producer would."
        ),
    )
    enqueue.add_argument("file", help="JSON file of messages")
    enqueue.add_argument("--thread", required=True, help="thread id")
    add_user_argument(enqueue, option=True)
    enqueue.add_argument("--agent", default=None, help="agent name (default: user-global memory)")
    enqueue.add_argument("--flush", action="store_true", help="due now, skip the debounce")
    enqueue.set_defaults(run=run_enqueue)

    stats = sub.add_parser("stats", help="queue depths, lag, extractions and tokens")
    stats.add_argument("--json", action="store_true", help="print JSON")
    stats.set_defaults(run=run_stats)

    dead = sub.add_parser("dead", help="list, retry or purge the dead letters")
    actions = dead.add_subparsers(dest="action", metavar="ACTION", required=True)
    listing = actions.add_parser("list", help="dead contexts with their attempts and last error")
    listing.add_argument("--json", action="store_true", help="print JSON")
    listing.set_defaults(run=run_dead_list)
    for name, verb in (("retry", "put back in the queue now"), ("purge", "delete for good")):
        action = actions.add_parser(name, help=f"{verb}: the given context ids, or --all")
        action.add_argument("ids", nargs="*", metavar="CONTEXT_ID")
        action.add_argument("--all", action="store_true", help="every dead context")
        action.set_defaults(run=run_dead_action, verb=name)


def run_enqueue(args: argparse.Namespace, context: CommandContext) -> int:
    from producer.producer import MemoryProducer

    data = read_json_file(args.file)
    messages = data.get("messages") if isinstance(data, dict) else data
    if not isinstance(messages, list):
        raise CommandError(
            f"{args.file}: expected a JSON list of messages or an object with a `messages` list"
        )
    producer = MemoryProducer(context.settings, context.redis)
    try:
        result = producer.enqueue(args.thread, args.user, args.agent, messages, flush=args.flush)
    finally:
        producer.close()
    if result is None:
        raise CommandError(f"{args.file}: nothing to remember: {_why_nothing(messages, context)}")
    due = "now" if args.flush else _when(result.deadline_ms)
    print(
        f"enqueued {shown(result.context_id)} version {result.version} "
        f"({result.code.name.lower().replace('_', ' ')}), due {due}"
    )
    return 0


def _why_nothing(messages: list[Any], context: CommandContext) -> str:
    """What the producer needed and did not find (it only answers "nothing to send")."""
    from producer.messages import filter_messages_for_memory

    if not context.settings.enabled:
        return "MEMQ_ENABLED is false, so producers enqueue nothing"
    kept = filter_messages_for_memory(messages)
    users = sum(1 for m in kept if m.role == "user")
    answers = len(kept) - users
    missing = " and ".join(
        what for what, n in (("a user message", users), ("an assistant answer", answers)) if not n
    )
    return (
        f"it needs at least one user message and one assistant answer; missing: {missing} "
        f"({len(messages)} message(s) given; tool results, system prompts, tool-calling steps "
        "and upload-only turns are not remembered)"
    )


def _queue(context: CommandContext) -> Any:
    from worker.queue import QueueClient

    return QueueClient(context.settings, context.redis)


def run_stats(args: argparse.Namespace, context: CommandContext) -> int:
    from worker.metrics import read_metrics, read_shards
    from worker.queue import now_ms

    now = now_ms()
    shards = read_shards(context.redis, context.settings, now)
    snapshot = read_metrics(context.redis, context.settings)
    stats = stats_summary(shards, snapshot, now)
    if args.json:
        print_json(stats)
        return 0
    print(format_table(("figure", "value"), stats_rows(stats)))
    return 0


def stats_summary(shards: list[ShardGauges], snapshot: MetricsSnapshot, now: int) -> dict[str, Any]:
    """Everything `memq stats` knows, as plain data (what `--json` prints)."""
    return {
        "due": sum(s.due for s in shards),
        "inflight": sum(s.inflight for s in shards),
        "dead": sum(s.dead for s in shards),
        "oldest_due_lag_ms": max((s.oldest_due_lag_ms for s in shards), default=0),
        "last_tick_age_ms": None if snapshot.last_tick_ms is None else now - snapshot.last_tick_ms,
        "shards": [asdict(s) for s in shards],
        "extractions": {
            outcome: snapshot.extractions[outcome]
            for outcome in sorted(snapshot.extractions, key=_outcome_order)
        },
        "dead_lettered_total": snapshot.dead_lettered,
        "stale_runs": snapshot.stale_runs,
        "queue": {
            "claimed": snapshot.tick_claimed,
            "leases_expired": snapshot.leases_expired,
            "leases_expired_dead": snapshot.leases_dead,
            "released": snapshot.tick_released,
            "deferred": snapshot.tick_deferred,
        },
        "llm_requests": dict(sorted(snapshot.llm_requests.items())),
        "deferred": dict(sorted(snapshot.deferred.items())),
        "llm_latency_mean_seconds": (
            snapshot.llm_latency_sum_seconds / snapshot.llm_latency_count
            if snapshot.llm_latency_count
            else None
        ),
        "prompt_tokens": snapshot.prompt_tokens,
        "cached_tokens": snapshot.cached_tokens,
        "cached_share": snapshot.cached_share,
        "completion_tokens": snapshot.completion_tokens,
        "llm_cost_usd": snapshot.cost_usd,
        "cost_per_extraction_usd": snapshot.cost_per_extraction_usd,
        "cost_per_1000_turns_usd": snapshot.cost_per_1000_turns_usd,
        "turns_extracted": snapshot.turns_extracted,
        "forgets": snapshot.forgets,
        "context_messages_cut": snapshot.context_messages_cut,
    }


def _outcome_order(outcome: str) -> tuple[int, str]:
    from worker.metrics import EXTRACTION_OUTCOMES

    known = EXTRACTION_OUTCOMES.index(outcome) if outcome in EXTRACTION_OUTCOMES else 99
    return known, outcome


def stats_rows(stats: dict[str, Any]) -> list[tuple[str, object]]:
    """The table: current depths first, then totals since the counters began."""
    tick_age = stats["last_tick_age_ms"]
    rows: list[tuple[str, object]] = [
        ("due", stats["due"]),
        ("in flight", stats["inflight"]),
        ("dead letters now", stats["dead"]),
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
    rows += [
        ("dead-lettered in total (failed runs + expired leases)", stats["dead_lettered_total"]),
        ("stale runs discarded (lost their claim)", stats["stale_runs"]),
    ]
    queue = stats["queue"]
    rows += [
        ("queue: claimed and dispatched", queue["claimed"]),
        ("queue: leases expired, back to due", queue["leases_expired"]),
        ("queue: released (broker refused the send)", queue["released"]),
        ("queue: deferred (user at in-flight cap)", queue["deferred"]),
    ]
    rows += [(f"LLM requests: {result}", n) for result, n in stats["llm_requests"].items()]
    rows += [
        (f"runs deferred before the call: {reason.replace('_', ' ')}", n)
        for reason, n in stats["deferred"].items()
    ]
    if stats["llm_latency_mean_seconds"] is not None:
        rows.append(("LLM latency, mean", f"{stats['llm_latency_mean_seconds']:.2f} s"))
    rows += [
        ("prompt tokens", stats["prompt_tokens"]),
        ("prompt tokens: cached", _with_share(stats["cached_tokens"], stats["cached_share"])),
        ("completion tokens", stats["completion_tokens"]),
        ("LLM cost", _dollars(stats["llm_cost_usd"])),
        ("LLM cost per extraction", _dollars(stats["cost_per_extraction_usd"])),
        ("LLM cost per 1,000 turns", _dollars(stats["cost_per_1000_turns_usd"])),
        ("users forgotten", stats["forgets"]),
        ("messages cut to context_max_bytes", stats["context_messages_cut"]),
    ]
    return rows


def _with_share(count: int, share: float | None) -> str:
    return str(count) if share is None else f"{count} ({share:.0%})"


def _dollars(amount: float | None) -> str:
    """Dollars to a tenth of a micro-dollar, enough for one cheap call; "-" before any."""
    return "-" if amount is None else f"${amount:.6f}"


def run_dead_list(args: argparse.Namespace, context: CommandContext) -> int:
    entries = _queue(context).dead_list()
    if args.json:
        print_json(
            [
                {
                    "context_id": e.context_id,
                    "dead_at_ms": e.dead_at_ms,
                    "attempts": e.attempts,
                    "last_error": e.last_error,
                    "expires_at_ms": e.expires_at_ms,
                }
                for e in entries
            ]
        )
        return 0
    if not entries:
        print("no dead letters")
        return 0
    rows = [
        (e.context_id, _when(e.dead_at_ms), _when(e.expires_at_ms), e.attempts, e.last_error)
        for e in entries
    ]
    print(format_table(("context id", "died", "expires", "attempts", "last error"), rows))
    return 0


def run_dead_action(args: argparse.Namespace, context: CommandContext) -> int:
    if bool(args.ids) == bool(args.all):
        raise CommandError(f"dead {args.verb}: give context ids or --all (not both)")
    ids: Any = "all" if args.all else list(args.ids)
    queue = _queue(context)
    count = queue.dead_retry(ids) if args.verb == "retry" else queue.dead_purge(ids)
    if not args.all and count < len(args.ids):
        print(f"{len(args.ids) - count} of the given ids were not dead letters")
    done = "retried (due now)" if args.verb == "retry" else "purged"
    print(f"{count} dead context(s) {done}")
    return 0 if args.all or count == len(args.ids) else 1


def _when(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).astimezone().strftime("%Y-%m-%d %H:%M:%S")
