"""Erasure: remove everything memq holds about a user (or one agent of a user).

Memory documents with their history, and in the queue: pending, in-flight and dead contexts (the
raw conversation), watermarks and the per-user sets. The user's contexts are found through the
per-user set that enqueue keeps in each shard, so nothing scans the keyspace.

Contexts go first, documents last: deleting a context's hash takes its claim token with it, so a
run in flight for that user can no longer save (its fenced save is refused), and the documents
deleted afterwards cannot be re-created by it.
"""

from __future__ import annotations

import logging
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Final

from memq.core.errors import InvalidIdentifier
from memq.core.identity import decode_agent, validate_agent_name, validate_user_id
from memq.core.keys import KeySchema
from memq.core.metrics import MetricsRecorder
from memq.core.scripts import LuaScripts
from memq.core.settings import MemqSettings
from storage.base import MemoryStorage

if TYPE_CHECKING:
    from memq.core.connection import RedisClient

log = logging.getLogger("memq.erasure")

_BATCH = 500  # context ids per script call


class _AllAgents:
    def __repr__(self) -> str:
        return "ALL_AGENTS"


ALL_AGENTS: Final = _AllAgents()


@dataclass(frozen=True, slots=True)
class ErasureReport:
    """What was removed, by kind."""

    documents: int = 0
    pending: int = 0
    in_flight: int = 0
    dead: int = 0
    contexts: int = 0
    watermarks: int = 0
    user_sets: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    @property
    def total(self) -> int:
        return sum(self.as_dict().values())

    def describe(self) -> str:
        """``"1 memory document, 2 pending contexts, …"``: the kinds that were found."""
        parts = []
        for name, value in self.as_dict().items():
            if value:
                singular, plural = _NOUNS[name]
                parts.append(f"{value} {singular if value == 1 else plural}")
        return ", ".join(parts) or "nothing"


_NOUNS = {
    "documents": ("memory document (with its history)", "memory documents (with their history)"),
    "pending": ("pending context", "pending contexts"),
    "in_flight": ("context in flight", "contexts in flight"),
    "dead": ("dead letter", "dead letters"),
    "contexts": ("conversation deleted", "conversations deleted"),
    "watermarks": ("watermark", "watermarks"),
    "user_sets": ("per-user set", "per-user sets"),
}


def _agent_of(context_id: str) -> str | None:
    try:
        return decode_agent(context_id.rsplit(":", 1)[-1])
    except InvalidIdentifier:
        return None


def erase_scripts(client: RedisClient) -> LuaScripts:
    """The scripts :func:`erase` runs, registered on ``client``: keep it beside the client."""
    return LuaScripts(client, "storage", ("erase_contexts",))


def erase(
    settings: MemqSettings,
    client: RedisClient,
    storage: MemoryStorage,
    user_id: str,
    *,
    agent_name: str | _AllAgents | None = ALL_AGENTS,
    documents: bool = True,
    scripts: LuaScripts | None = None,
) -> ErasureReport:
    """Erase ``user_id`` (every agent and the user-global memory), or only ``agent_name`` of it
    (None: the user-global memory). ``documents=False`` keeps the memory documents and removes
    only the queued work (a clear that replaces the document itself). Idempotent.

    ``scripts``: :func:`erase_scripts` of ``client``, for a caller that erases often (built here
    when absent)."""
    user = validate_user_id(user_id)
    whole_user = isinstance(agent_name, _AllAgents)
    agent = None if isinstance(agent_name, _AllAgents) else validate_agent_name(agent_name)
    keys = KeySchema(settings.key_prefix, settings.shards)
    script = (scripts or erase_scripts(client))["erase_contexts"]
    totals = [0] * 6
    for shard in keys.all_shards():
        members = sorted(
            m.decode("utf-8") if isinstance(m, bytes) else str(m)
            for m in client.smembers(shard.user_contexts(user))
        )
        if not whole_user:
            members = [m for m in members if _agent_of(m) == agent]
        batches = [members[i : i + _BATCH] for i in range(0, len(members), _BATCH)] or [[]]
        for index, batch in enumerate(batches):
            drop_sets = whole_user and index == len(batches) - 1
            if not batch and not drop_sets:
                continue
            script_keys = [
                shard.due,
                shard.inflight,
                shard.dead,
                shard.user_inflight(user),
                shard.user_contexts(user),
            ]
            for context_id in batch:
                script_keys += (shard.context(context_id), shard.watermark(context_id))
            raw = script(keys=script_keys, args=["1" if drop_sets else "0", *batch])
            totals = [t + int(r) for t, r in zip(totals, raw, strict=True)]
    removed_documents = 0
    if documents:
        targets: set[str | None]
        if whole_user:
            targets = {validate_agent_name(a) for a in storage.list_agents(user)} | {None}
        else:
            targets = {agent}
        removed_documents = sum(storage.delete(user, target) for target in targets)
    report = ErasureReport(removed_documents, *totals)
    if whole_user:
        MetricsRecorder.for_settings(settings, client).forget()
    log.info(
        "erased user=%s agent=%s: %s",
        user,
        "*" if whole_user else (agent or "-"),
        report.describe(),
    )
    return report
