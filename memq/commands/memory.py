"""`memq show | inject | facts | export | import | forget`: a user's memory, by hand.

Every write goes through :class:`storage.management.MemoryManager`, so a hand edit is serialised
with running extractions and recorded in the document's history.
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import TYPE_CHECKING

from memq.commands.common import (
    CommandContext,
    CommandError,
    add_user_argument,
    agent_label,
    format_table,
    print_json,
    read_json_file,
    shown,
    user_json,
    user_label,
)
from memq.core.identity import validate_agent_name, validate_user_id
from memq.operations.access import LOCAL
from storage.vocabulary import CATEGORIES

if TYPE_CHECKING:
    from memq.operations.service import MemqService
    from storage.document import Fact, MemoryDocument

SECTIONS = (
    ("user", ("work_context", "personal_context", "top_of_mind")),
    ("history", ("recent_months", "earlier_context", "long_term_background")),
)


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    show = sub.add_parser(
        "show",
        help="what memq knows about a user: every agent's memory, or one with --agent",
        description=(
            "Print a user's memory documents: the summaries and a table of facts (id, category, "
            "confidence, fact, source), most confident first. Without --agent, every agent the "
            "user has a memory for, user-global memory included."
        ),
    )
    add_user_argument(show)
    show.add_argument(
        "--agent",
        default=None,
        help="only this agent's memory (default: every agent of the user)",
    )
    show.add_argument("--json", action="store_true", help="print the memory documents as JSON")
    show.set_defaults(run=run_show)

    inject = sub.add_parser("inject", help="the <user_memory> block an agent would get")
    _user_agent(inject)
    inject.add_argument(
        "--query", default=None, help="the user's message: recall facts relevant to it first"
    )
    inject.set_defaults(run=run_inject)

    facts = sub.add_parser("facts", help="add, edit, delete or search facts by hand")
    verbs = facts.add_subparsers(dest="verb", metavar="ACTION", required=True)
    add = verbs.add_parser("add", help="add a fact")
    _user_agent(add)
    add.add_argument("content")
    add.add_argument("--category", default="context", help=f"one of: {', '.join(CATEGORIES)}")
    add.add_argument("--confidence", type=float, default=0.9)
    add.set_defaults(run=run_facts_add)
    edit = verbs.add_parser("edit", help="change a fact's content, category or confidence")
    _user_agent(edit)
    edit.add_argument("fact_id")
    edit.add_argument("--content")
    edit.add_argument("--category", help=f"one of: {', '.join(CATEGORIES)}")
    edit.add_argument("--confidence", type=float)
    edit.set_defaults(run=run_facts_edit)
    delete = verbs.add_parser("delete", help="delete a fact")
    _user_agent(delete)
    delete.add_argument("fact_id")
    delete.set_defaults(run=run_facts_delete)
    search = verbs.add_parser(
        "search", help="facts most relevant to a query (BM25, English and Chinese)"
    )
    _user_agent(search)
    search.add_argument("query")
    search.add_argument("--category")
    search.add_argument("--limit", type=int, default=10)
    search.set_defaults(run=run_facts_search)

    export = sub.add_parser("export", help="a user's memory as memq memory.json")
    _user_agent(export)
    export.add_argument("-o", "--output", type=Path, help="write to this file instead of stdout")
    export.set_defaults(run=run_export)
    load = sub.add_parser(
        "import",
        help="replace a user's memory with a memq or DeerFlow JSON file, or migrate a whole "
        "DeerFlow memory folder (--deerflow DIR)",
    )
    add_user_argument(load, optional=True, then="file")
    load.add_argument("file", nargs="?")
    load.add_argument("--agent", default=None, help="agent name (default: user-global memory)")
    load.add_argument(
        "--deerflow",
        metavar="DIR",
        type=Path,
        help="a DeerFlow memory folder (every user and agent, old and current layout); merges, "
        "safe to re-run",
    )
    load.add_argument(
        "--replace",
        action="store_true",
        help="empty the memory when the file holds no fact (refused without it)",
    )
    load.set_defaults(run=run_import)

    forget = sub.add_parser(
        "forget",
        help="erase everything held about a user: memory of every agent with its history, "
        "pending, in-flight and dead conversations, watermarks",
    )
    add_user_argument(forget)
    forget.add_argument(
        "--agent",
        default=None,
        help="only this agent's memory and queued work (e.g. an agent that was deleted); the "
        "user's other memories stay",
    )
    forget.add_argument(
        "--thread",
        default=None,
        help="forget only this thread (in every agent's memory): facts learnt only from it, its "
        "sources in other facts, its history entries, its queued conversations and watermark",
    )
    forget.add_argument("--json", action="store_true", help="print what was removed as JSON")
    forget.set_defaults(run=run_forget)


def _user_agent(parser: argparse.ArgumentParser) -> None:
    add_user_argument(parser)
    parser.add_argument("--agent", default=None, help="agent name (default: user-global memory)")


def _require(
    svc: MemqService, user: str, agent: str | None, *, any_agent: bool = False
) -> list[str | None]:
    """The agents of ``user`` with a stored memory; an unknown user or agent is a clear error."""
    user = validate_user_id(user)
    agents = svc.list_agents(LOCAL, user)
    if not agents:
        raise CommandError(f"unknown user {user_label(user, quoted=True)}: no memory stored for it")
    if any_agent:
        return agents
    wanted = validate_agent_name(agent)
    if wanted not in agents:
        known = ", ".join(agent_label(a) for a in agents)
        raise CommandError(
            f"user {user_label(user, quoted=True)} has no memory for agent {agent_label(wanted)} "
            f"(it has: {known})"
        )
    return [wanted]


def run_show(args: argparse.Namespace, context: CommandContext) -> int:
    svc = context.service
    agents = _require(svc, args.user, args.agent, any_agent=args.agent is None)
    documents = [(a, svc.document(LOCAL, args.user, a)) for a in agents]
    if args.json:
        print_json(
            {
                "user_id": user_json(args.user),
                "memories": [{"agent_name": a, "memory": d.to_json()} for a, d in documents],
            }
        )
        return 0
    for index, (agent, document) in enumerate(documents):
        if index:
            print()
        print(_render(args.user, agent, document))
    return 0


def _render(user: str, agent: str | None, document: MemoryDocument) -> str:
    updated = document.last_updated.isoformat(timespec="seconds") if document.last_updated else "-"
    lines = [
        f"user {user_label(user)} · agent {shown(agent_label(agent))} · "
        f"{count(len(document.facts), 'fact')}"
        f" · updated {updated}"
    ]
    for group, names in SECTIONS:
        for name in names:
            summary = getattr(getattr(document, group), name).summary.strip()
            if summary:
                lines.append(f"{name.replace('_', ' ')}: {shown(summary)}")
    if document.facts:
        lines.append(_facts_table(sorted(document.facts, key=lambda f: -f.confidence)))
    return "\n".join(lines)


def _facts_table(facts: list[Fact]) -> str:
    rows = [
        (f.id, f.category, f"{f.confidence:.2f}", f.content, f.source_thread_id or f.source)
        for f in facts
    ]
    return format_table(("id", "category", "confidence", "fact", "source"), rows)


def count(n: int, noun: str) -> str:
    """``1 fact``, ``2 facts``."""
    return f"{n} {noun}" if n == 1 else f"{n} {noun}s"


def run_inject(args: argparse.Namespace, context: CommandContext) -> int:
    svc = context.service
    (agent,) = _require(svc, args.user, args.agent)
    block = svc.recall(LOCAL, args.user, agent, query=args.query)
    if not block:
        raise CommandError(
            f"nothing to inject for user {user_label(args.user, quoted=True)}, "
            f"agent {agent_label(agent)} "
            "(empty memory, or injection disabled by MEMQ_ENABLED/MEMQ_INJECTION_ENABLED)"
        )
    print(shown(block, keep_newlines=True))  # its line breaks are the renderer's own
    return 0


def run_facts_add(args: argparse.Namespace, context: CommandContext) -> int:
    from memq.core.errors import FactEvicted

    # Held to the same fact cap as an extraction: the new fact may be the one evicted.
    try:
        fact = context.service.add_fact(
            LOCAL,
            args.user,
            args.agent,
            args.content,
            category=args.category,
            confidence=args.confidence,
        )
    except FactEvicted as exc:
        raise CommandError(
            f"not added to user {user_label(args.user)}, agent "
            f"{agent_label(validate_agent_name(args.agent))}: {exc}"
        ) from exc
    print(
        f"added {fact.id} to user {user_label(args.user)}, "
        f"agent {agent_label(validate_agent_name(args.agent))}"
    )
    return 0


def run_facts_edit(args: argparse.Namespace, context: CommandContext) -> int:
    if args.content is None and args.category is None and args.confidence is None:
        raise CommandError("facts edit: give --content, --category and/or --confidence")
    svc = context.service
    (agent,) = _require(svc, args.user, args.agent)
    fact = svc.edit_fact(
        LOCAL,
        args.user,
        agent,
        args.fact_id,
        content=args.content,
        category=args.category,
        confidence=args.confidence,
    )
    print(_facts_table([fact]))
    return 0


def run_facts_delete(args: argparse.Namespace, context: CommandContext) -> int:
    svc = context.service
    (agent,) = _require(svc, args.user, args.agent)
    fact = svc.delete_fact(LOCAL, args.user, agent, args.fact_id)
    print(f"deleted {shown(fact.id)}: {shown(fact.content)}")
    return 0


def run_facts_search(args: argparse.Namespace, context: CommandContext) -> int:
    svc = context.service
    (agent,) = _require(svc, args.user, args.agent)
    found = svc.search(
        LOCAL, args.user, agent, args.query, category=args.category, limit=args.limit
    )
    if not found:
        print(f"no fact of user {user_label(args.user)} matches {args.query!r}")
        return 1
    print(_facts_table(found))
    return 0


def run_export(args: argparse.Namespace, context: CommandContext) -> int:
    svc = context.service
    (agent,) = _require(svc, args.user, args.agent)
    data = svc.export(LOCAL, args.user, agent)
    if args.output is None:
        print_json(data)
        return 0
    args.output.write_text(json.dumps(data, ensure_ascii=False, indent=2) + "\n", encoding="utf-8")
    print(f"exported {count(len(data.get('facts', [])), 'fact')} to {args.output}")
    return 0


def run_import(args: argparse.Namespace, context: CommandContext) -> int:
    if args.deerflow is not None:
        if args.user is not None or args.agent is not None:
            raise CommandError("import --deerflow DIR takes no USER, FILE or --agent")
        from memq.integrations.deerflow_import import import_folder

        report = import_folder(
            context.storage, args.deerflow, fact_max_chars=context.settings.fact_max_chars
        )
        print(f"imported DeerFlow memory from {args.deerflow}: {report.describe()}")
        return 0
    if args.user is None or args.file is None:
        raise CommandError("import needs USER FILE, or --deerflow DIR")
    data = read_json_file(args.file)
    if not isinstance(data, dict):
        raise CommandError(f"{args.file}: a memory document must be a JSON object")
    document, cut = context.service.import_document(
        LOCAL, args.user, args.agent, data, replace=args.replace
    )
    agent = agent_label(validate_agent_name(args.agent))
    limit = context.settings.fact_max_chars
    note = f" ({count(cut, 'over-long fact')} cut to {limit} characters)" if cut else ""
    print(
        f"imported {count(len(document.facts), 'fact')} into user {user_label(args.user)}, "
        f"agent {agent}{note}"
    )
    return 0


def run_forget(args: argparse.Namespace, context: CommandContext) -> int:
    user = validate_user_id(args.user)
    if args.thread is not None:
        if getattr(args, "agent", None) is not None:
            raise CommandError("forget --thread T forgets the thread in every agent: no --agent")
        done = context.service.forget_thread(LOCAL, user, args.thread)
        if getattr(args, "json", False):
            print_json(
                {"user_id": user_json(user), "thread_id": args.thread, "removed": done.as_dict()}
            )
            return 0
        print(
            f"forgot thread {args.thread!r} of user {user_label(user)}: "
            f"{count(done.facts_removed, 'fact')} removed, "
            f"{count(done.facts_trimmed, 'fact')} kept without it, "
            f"{count(done.contexts, 'conversation')} deleted"
        )
        return 0
    agent_arg = getattr(args, "agent", None)
    agent = None if agent_arg is None else validate_agent_name(agent_arg)
    svc = context.service
    report = svc.forget_user(LOCAL, user) if agent is None else svc.forget_agent(LOCAL, user, agent)
    who = f"user {user_label(user)}"
    if agent is not None:
        who = f"agent {shown(agent)} of {who}"
    if getattr(args, "json", False):
        print_json({"user_id": user_json(user), "agent_name": agent, "removed": report.as_dict()})
        return 0
    if report.total == 0:
        print(f"nothing held about {who}: no memory, no queued work (already forgotten?)")
        return 0
    print(f"forgot {who}: {report.describe()}")
    return 0
