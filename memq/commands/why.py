"""`memq why USER FACT_ID`: where a fact came from — its sources, confirmations, what it
superseded or what superseded it, and its whole change history."""

from __future__ import annotations

import argparse
from datetime import datetime

from memq.commands.common import (
    CommandContext,
    add_user_argument,
    format_table,
    print_json,
    shown,
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    why = sub.add_parser(
        "why",
        help="where a fact came from: its sources, confirmations and whole change history",
    )
    add_user_argument(why)
    why.add_argument("fact_id")
    why.add_argument("--agent", default=None, help="agent name (default: user-global memory)")
    why.add_argument("--json", action="store_true", help="print the explanation as JSON")
    why.set_defaults(run=run_why)


def _when(value: datetime | None) -> str:
    return "-" if value is None else value.isoformat(timespec="seconds")


def run_why(args: argparse.Namespace, context: CommandContext) -> int:
    from memq.operations.access import LOCAL

    explanation = context.service.why(LOCAL, args.user, args.agent, args.fact_id)
    if args.json:
        print_json(explanation.to_json())
        return 0
    fact = explanation.fact
    print(f"fact {shown(explanation.fact_id)} ({explanation.status})")
    if fact is not None:
        print(
            f"  {shown(fact.content)}  [{shown(fact.category)}, confidence {fact.confidence:.2f}]"
        )
    own = explanation.superseded
    if own is not None:
        by = ", ".join(shown(i) for i in own.replaced_by) or "nothing"
        print(
            f"  superseded ({own.kind}) at {_when(own.superseded_at)} by {by}: {shown(own.reason)}"
        )
    print(f"  confirmations: {explanation.confirmations}")
    print("sources:")
    header = ["thread", "attribution", "roles", "messages", "run", "when", "model", "prompt"]
    rows = [
        [
            shown(s.thread_id or "-"),
            s.attribution,
            ",".join(s.roles) or "-",
            str(len(s.messages)),
            shown(s.run_id or "-"),
            _when(s.at),
            shown(s.model or "-"),
            shown(s.prompt_version or "-"),
        ]
        for s in explanation.sources
    ]
    print(format_table(header, rows) if rows else "  (none recorded)")
    for s in explanation.sources:
        for excerpt in s.excerpts:  # the cited messages, as their sources keep them
            print(f"  {shown(s.thread_id or '-')} said: {shown(excerpt)}")
    if explanation.supersedes:
        print("supersedes:")
        for entry in explanation.supersedes:
            print(f"  {shown(entry.fact.id)} ({entry.kind}): {shown(entry.fact.content)}")
    print("history:")
    for change in explanation.history:
        print(
            f"  {_when(change.at)}  {change.action:<9} {shown(change.fact_id or '-')}  "
            f"{shown(change.reason)}"
        )
    return 0
