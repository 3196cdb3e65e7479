"""A small in-memory :class:`storage.base.MemoryStorage` for algorithm tests.

It keeps the storage contract (tests/test_storage_contract.py runs it beside the real backends):
ids validated and agent names folded by the same rules, documents copied in and out and stamped
on save, an update that changes nothing writes nothing, history newest first and bounded by
``history_max_entries``. Only fencing is absent: there is no queue behind it to check a claim
against. ``lock`` is the per-store write lock; tests check it is free while the LLM is called.
"""

from __future__ import annotations

import threading

from memq.core.identity import validate_agent_name, validate_user_id
from memq.core.settings import MemqSettings
from storage.base import Change, Fence, RewriteFn, UpdateFn
from storage.document import MemoryDocument, copy_document, empty_document
from storage.history import bounded, newest_first, split_update_result, stamp_for_save

Key = tuple[str, str | None]


def _key(user_id: str | None, agent_name: str | None) -> Key:
    return validate_user_id(user_id), validate_agent_name(agent_name)


class InMemoryStorage:
    def __init__(self, settings: MemqSettings | None = None) -> None:
        self.history_max_entries = (settings or MemqSettings()).history_max_entries
        self.lock = threading.Lock()
        self.documents: dict[Key, MemoryDocument] = {}
        self.histories: dict[Key, list[Change]] = {}
        self.saves = 0

    def load(self, user_id: str | None, agent_name: str | None = None) -> MemoryDocument:
        key = _key(user_id, agent_name)
        with self.lock:
            doc = self.documents.get(key)
            return copy_document(doc) if doc is not None else empty_document()

    def _write(self, key: Key, document: MemoryDocument, changes: list[Change]) -> MemoryDocument:
        saved = stamp_for_save(document)
        self.documents[key] = saved
        history = self.histories.get(key, []) + changes
        self.histories[key] = bounded(history, self.history_max_entries)
        self.saves += 1
        return copy_document(saved)

    def save(
        self,
        user_id: str | None,
        agent_name: str | None,
        document: MemoryDocument,
        *,
        changes: list[Change] | None = None,
    ) -> None:
        key = _key(user_id, agent_name)
        with self.lock:
            self._write(key, document, list(changes or []))

    def fence_run(self, user_id: str | None, agent_name: str | None, fence: Fence) -> None:
        """No queue behind this store: nothing to fence against."""

    def update(
        self,
        user_id: str | None,
        agent_name: str | None,
        fn: UpdateFn,
        *,
        fence: Fence | None = None,
    ) -> MemoryDocument:
        key = _key(user_id, agent_name)
        with self.lock:
            current = self.documents.get(key)
            latest = copy_document(current) if current is not None else empty_document()
            before = copy_document(latest)  # the callback may change its argument in place
            document, changes = split_update_result(fn(latest))
            if document == before and not changes:
                return document
            return self._write(key, document, changes)

    def history(
        self, user_id: str | None, agent_name: str | None = None, *, limit: int = 100
    ) -> list[Change]:
        key = _key(user_id, agent_name)
        with self.lock:
            return newest_first(self.histories.get(key, []), limit)

    def rewrite(self, user_id: str | None, agent_name: str | None, fn: RewriteFn) -> bool:
        key = _key(user_id, agent_name)
        with self.lock:
            current = self.documents.get(key)
            if current is None:
                return False
            result = fn(copy_document(current), list(self.histories.get(key, [])))
            if result is None:
                return False
            self.documents[key] = stamp_for_save(result[0])
            self.histories[key] = bounded(list(result[1]), self.history_max_entries)
            return True

    def list_agents(self, user_id: str | None) -> list[str | None]:
        user = validate_user_id(user_id)
        with self.lock:
            agents = [agent for owner, agent in self.documents if owner == user]
        return sorted(agents, key=lambda a: (a is not None, a or ""))

    def list_users(self) -> list[str]:
        with self.lock:
            return sorted({user for user, _ in self.documents})

    def delete(self, user_id: str | None, agent_name: str | None) -> bool:
        key = _key(user_id, agent_name)
        with self.lock:
            self.histories.pop(key, None)
            return self.documents.pop(key, None) is not None
