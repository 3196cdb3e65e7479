"""What the oracle judges, read once the run is over: the turns the agents recorded, the stored
memory, the dead letters and a dump of every Redis key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import redis

from bench.soak.oracle import MARKER, DeadLetter, DocKey, StoredFact, Turn
from memq.core.identity import ContextKey
from memq.core.keys import KeySchema
from memq.core.settings import MemqSettings
from memq.testing.redis_dump import text_of
from storage import get_storage
from worker.queue import QueueClient


def read_turns(control_dir: Path) -> tuple[list[Turn], dict[str, Any]]:
    """Every agent's turns, and its producer's counters summed (plus ``ever_spooled``)."""
    turns: list[Turn] = []
    totals: dict[str, Any] = {"ever_spooled": 0}
    for path in sorted(control_dir.glob("turns-*.jsonl")):
        for line in path.read_text(encoding="utf-8").splitlines():
            row = json.loads(line)
            totals["ever_spooled"] += int(row.pop("ever_spooled", False))
            turns.append(Turn(**row))
    for path in sorted(control_dir.glob("stats-*.json")):
        for name, value in json.loads(path.read_text(encoding="utf-8")).items():
            totals[name] = totals.get(name, 0) + int(value)
    return turns, totals


def read_documents(
    settings: MemqSettings, client: redis.Redis
) -> tuple[dict[DocKey, list[StoredFact]], dict[DocKey, str]]:
    """Every stored document's facts (through the storage API) and its raw JSON (from Redis)."""
    storage = get_storage(settings, redis=client)
    keys = KeySchema(settings.key_prefix, settings.shards)
    documents: dict[DocKey, list[StoredFact]] = {}
    raw: dict[DocKey, str] = {}
    for user in storage.list_users():
        for agent in storage.list_agents(user):
            doc = storage.load(user, agent)
            documents[(user, agent)] = [
                StoredFact(
                    content=fact.content,
                    created_ms=int(fact.created_at.timestamp() * 1000)
                    if fact.created_at is not None
                    else None,
                )
                for fact in doc.facts
            ]
            text = client.hget(keys.memory_document(user, agent), "doc")
            if text is None:
                text = _find_raw_document(client, user, agent)
            raw[(user, agent)] = (
                text_of(text)
                if text is not None
                else f"<no stored text found for this document: adapt {__name__} to the key layout>"
            )
    return documents, raw


def _find_raw_document(client: redis.Redis, user: str, agent: str | None) -> Any:
    """The ``doc`` field of any hash whose name holds the pair (the key layout may have moved)."""
    for key in client.scan_iter(match=f"*{user}*{agent or ''}*", count=1000):
        if text_of(client.type(key)) == "hash":
            text = client.hget(key, "doc")
            if text is not None:
                return text
    return None


def read_dead_letters(queue: QueueClient) -> list[DeadLetter]:
    letters = []
    for entry in queue.dead_list(limit=100_000):
        key = ContextKey.from_id(entry.context_id)
        data = queue.load(entry.context_id)
        letters.append(
            DeadLetter(
                context_id=entry.context_id,
                user=key.user_id,
                agent=key.agent_name,
                reason=entry.last_error,
                markers=frozenset(MARKER.findall(data.get("messages", ""))),
            )
        )
    return letters
