"""`memq enqueue`, `memq stats`, `memq dead`: the queue, seen and repaired from a shell."""

from __future__ import annotations

import argparse
from datetime import UTC, datetime
from typing import Any

from memq.commands.common import (
    CommandContext,
    CommandError,
    add_user_argument,
    format_table,
    print_json,
    read_json_file,
    shown,
)
from memq.operations.access import LOCAL
from memq.operations.stats_rows import stats_rows


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


def run_stats(args: argparse.Namespace, context: CommandContext) -> int:
    stats = context.service.stats(LOCAL)
    if args.json:
        print_json(stats)
        return 0
    print(format_table(("figure", "value"), stats_rows(stats)))
    return 0


def run_dead_list(args: argparse.Namespace, context: CommandContext) -> int:
    entries = context.service.dead_letters(LOCAL)
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
    svc = context.service
    count = svc.retry_dead(LOCAL, ids) if args.verb == "retry" else svc.purge_dead(LOCAL, ids)
    if not args.all and count < len(args.ids):
        print(f"{len(args.ids) - count} of the given ids were not dead letters")
    done = "retried (due now)" if args.verb == "retry" else "purged"
    print(f"{count} dead context(s) {done}")
    return 0 if args.all or count == len(args.ids) else 1


def _when(epoch_ms: int) -> str:
    return datetime.fromtimestamp(epoch_ms / 1000, UTC).astimezone().strftime("%Y-%m-%d %H:%M:%S")
