"""The one table of operations: what each needs (scope) and whose data it reaches (span).

Every door checks a call against this table through :func:`authorize` — the HTTP routes in their
``Authorize`` dependency, the inspector in ``Access``, the MCP tools and the service itself — and
``tests/test_operation_table.py`` sweeps every route, page and tool against it, so a new door
cannot forget the check or pick a scope of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Literal

from memq.operations.access import Principal, Scope

# `user`: one user's data (a key bound to a user-id prefix reaches only its users);
# `listing`: a list of users, filtered to what the key reaches;
# `every_user`: data of every user at once (never for a prefix-bound key).
Span = Literal["user", "listing", "every_user"]


@dataclass(frozen=True, slots=True)
class Operation:
    name: str
    scope: Scope
    span: Span
    summary: str


def _table(*rows: tuple[str, Scope, Span, str]) -> Mapping[str, Operation]:
    return {name: Operation(name, scope, span, summary) for name, scope, span, summary in rows}


OPERATIONS: Mapping[str, Operation] = _table(
    # What an agent does around each turn.
    ("hand_off", "agent", "user", "hand a conversation over for extraction (flush: due now)"),
    ("recall", "agent", "user", "the <user_memory> block for the next prompt"),
    ("search", "agent", "user", "the facts most relevant to a query"),
    ("read_memory", "agent", "user", "the memory document, its facts and summaries"),
    ("why", "agent", "user", "where a fact came from"),
    ("history", "agent", "user", "the recorded changes of a memory"),
    ("superseded", "agent", "user", "the facts that stopped being valid"),
    ("list_users", "agent", "listing", "the users with a memory (those the key reaches)"),
    # What an operator does by hand.
    ("add_fact", "admin", "user", "add a fact by hand"),
    ("edit_fact", "admin", "user", "change a fact's content, category or confidence"),
    ("delete_fact", "admin", "user", "delete a fact"),
    ("export", "admin", "user", "the memory as memq or DeerFlow memory.json"),
    ("import", "admin", "user", "replace a memory with an imported document"),
    ("forget_user", "admin", "user", "erase everything held about a user"),
    ("forget_agent", "admin", "user", "erase one agent's memory of a user"),
    ("forget_thread", "admin", "user", "forget one thread in every agent's memory"),
    # The queue, across every user.
    ("stats", "admin", "every_user", "queue depths, outcomes, tokens and bill"),
    ("dead_letters", "admin", "every_user", "the dead letters with their reasons"),
    ("retry_dead", "admin", "every_user", "put dead letters back in the queue"),
    ("purge_dead", "admin", "every_user", "delete dead letters for good"),
)


def operation(name: str) -> Operation:
    try:
        return OPERATIONS[name]
    except KeyError:
        raise KeyError(f"no operation {name!r} in memq.operations.table") from None


def authorize(who: Principal, name: str, user_id: str | None = None) -> Operation:
    """Refuse (``Forbidden``) a caller the table does not allow ``name`` for ``user_id``."""
    op = operation(name)
    who.require_scope(op.scope)
    if op.span == "every_user":
        who.require_all_users()
    elif op.span == "user":
        if user_id is None:
            raise TypeError(f"operation {name!r} needs the user it reaches")
        who.require_user(user_id)
    return op
