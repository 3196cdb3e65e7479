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
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Final

from memq.core.errors import InvalidIdentifier, MemqError
from memq.core.identity import (
    ContextKey,
    decode_agent,
    encode_user,
    validate_agent_name,
    validate_thread_id,
    validate_user_id,
)
from memq.core.keys import KeySchema
from memq.core.metrics import MetricsRecorder
from memq.core.scripts import LuaScripts
from memq.core.settings import MemqSettings
from storage.base import Change, MemoryStorage
from storage.document import MemoryDocument
from storage.provenance import (
    ThreadForgetResult,
    forget_thread,
    history_without_thread,
    section_threads,
)

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


def _thread_of(context_id: str) -> str | None:
    try:
        return ContextKey.from_id(context_id).thread_id
    except MemqError:
        return None


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
    totals = _erase_contexts(
        settings,
        client,
        user,
        (lambda m: True) if whole_user else (lambda m: _agent_of(m) == agent),
        drop_sets=whole_user,
        scripts=scripts,
    )
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


def _erase_contexts(
    settings: MemqSettings,
    client: RedisClient,
    user: str,
    wanted: Callable[[str], bool],
    *,
    drop_sets: bool,
    scripts: LuaScripts | None,
) -> list[int]:
    """Remove the user's contexts whose id ``wanted`` accepts from every queue structure of every
    shard (with their watermarks); ``drop_sets`` also deletes the per-user sets. The counts of
    ``erase_contexts.lua``, summed over the shards."""
    keys = KeySchema(settings.key_prefix, settings.shards)
    script = (scripts or erase_scripts(client))["erase_contexts"]
    totals = [0] * 6
    for shard in keys.all_shards():
        members = sorted(str(m) for m in client.smembers(shard.user_contexts(user)))
        members = [m for m in members if wanted(m)]
        batches = [members[i : i + _BATCH] for i in range(0, len(members), _BATCH)] or [[]]
        for index, batch in enumerate(batches):
            drop = drop_sets and index == len(batches) - 1
            if not batch and not drop:
                continue
            script_keys = [
                shard.due,
                shard.inflight,
                shard.dead,
                shard.user_leases,
                shard.user_contexts(user),
                shard.batch_pending,
                shard.batched,
                shard.claims,
            ]
            for context_id in batch:
                script_keys += (shard.context(context_id), shard.watermark(context_id))
            raw = script(keys=script_keys, args=["1" if drop else "0", encode_user(user), *batch])
            totals = [t + int(r) for t, r in zip(totals, raw, strict=True)]
    return totals


@dataclass(frozen=True, slots=True)
class ThreadErasureReport:
    """What forgetting one thread of a user removed."""

    facts_removed: int = 0  # learnt only from the thread (current or superseded)
    facts_trimmed: int = 0  # learnt elsewhere too: they stay, without the thread's sources
    sections_cleared: int = 0  # summaries last rewritten from the thread
    documents: int = 0  # documents rewritten
    pending: int = 0
    in_flight: int = 0
    dead: int = 0
    contexts: int = 0
    watermarks: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def erase_thread(
    settings: MemqSettings,
    client: RedisClient,
    storage: MemoryStorage,
    user_id: str,
    thread_id: str,
    *,
    scripts: LuaScripts | None = None,
) -> ThreadErasureReport:
    """Forget one thread of a user, in every agent's memory and the user-global one: facts
    learnt only from it go, other facts lose its sources, summaries last rewritten from it are
    emptied, every history entry its runs wrote or about a fact removed goes, and its pending,
    in-flight and dead contexts and watermarks are deleted. Contexts first, as for a user: a run
    of the thread in flight loses its claim and its save is refused. Idempotent."""
    user = validate_user_id(user_id)
    thread = validate_thread_id(thread_id)
    counts = _erase_contexts(
        settings, client, user, lambda m: _thread_of(m) == thread, drop_sets=False, scripts=scripts
    )
    removed = trimmed = cleared = documents = 0
    for agent in {validate_agent_name(a) for a in storage.list_agents(user)} | {None}:
        result = _forget_thread_in(storage, user, agent, thread)
        if result is not None:
            documents += 1
            removed += len(result.removed)
            trimmed += result.trimmed
            cleared += len(result.sections_cleared)
    report = ThreadErasureReport(removed, trimmed, cleared, documents, *counts[:5])
    log.info(
        "erased a thread of user=%s: %d facts removed, %d kept without it, %d contexts",
        user,
        removed,
        trimmed,
        report.contexts,
    )
    return report


def _forget_thread_in(
    storage: MemoryStorage, user: str, agent: str | None, thread: str
) -> ThreadForgetResult | None:
    """Forget ``thread`` in one document and its history; None when nothing there named it."""
    done: list[ThreadForgetResult] = []

    def rewrite(
        document: MemoryDocument, history: list[Change]
    ) -> tuple[MemoryDocument, list[Change]] | None:
        doc, result = forget_thread(document, thread, section_threads=section_threads(history))
        kept = history_without_thread(history, thread, result.removed)
        if not result.changed and len(kept) == len(history):
            return None
        done[:] = [result]
        note = Change(
            action="forget",
            reason=f"forgot a thread: {len(result.removed)} facts removed, "
            f"{result.trimmed} kept without its sources",
        )
        return doc, [*kept, note]

    return done[0] if storage.rewrite(user, agent, rewrite) and done else None
