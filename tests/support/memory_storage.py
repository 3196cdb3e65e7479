"""A small in-memory :class:`storage.base.MemoryStorage` for algorithm tests.

Documents are deep-copied in and out, like a real backend, so a test cannot pass by sharing objects.
``lock`` is the per-store write lock; tests check it is free while the LLM is being called.
"""

from __future__ import annotations

import threading

from storage.base import Change, Fence, RewriteFn, UpdateFn, UpdateResult
from storage.document import MemoryDocument

Key = tuple[str, str | None]


class InMemoryStorage:
    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.documents: dict[Key, MemoryDocument] = {}
        self.histories: dict[Key, list[Change]] = {}
        self.saves = 0

    def load(self, user_id: str, agent_name: str | None = None) -> MemoryDocument:
        with self.lock:
            doc = self.documents.get((user_id, agent_name))
            return doc.model_copy(deep=True) if doc is not None else MemoryDocument()

    def _write(self, key: Key, document: MemoryDocument, changes: list[Change] | None) -> None:
        self.documents[key] = document.model_copy(deep=True)
        self.histories.setdefault(key, []).extend(changes or [])
        self.saves += 1

    def save(
        self,
        user_id: str,
        agent_name: str | None,
        document: MemoryDocument,
        *,
        changes: list[Change] | None = None,
    ) -> None:
        with self.lock:
            self._write((user_id, agent_name), document, changes)

    def fence_run(self, user_id: str, agent_name: str | None, fence: Fence) -> None:
        """No queue behind this store: nothing to fence against."""

    def update(
        self, user_id: str, agent_name: str | None, fn: UpdateFn, *, fence: Fence | None = None
    ) -> MemoryDocument:
        key = (user_id, agent_name)
        with self.lock:
            current = self.documents.get(key)
            latest = current.model_copy(deep=True) if current is not None else MemoryDocument()
            result = fn(latest)
            if isinstance(result, UpdateResult):
                self._write(key, result.document, result.changes)
                return result.document.model_copy(deep=True)
            self._write(key, result, None)
            return result.model_copy(deep=True)

    def history(
        self, user_id: str, agent_name: str | None = None, *, limit: int = 100
    ) -> list[Change]:
        with self.lock:
            return list(self.histories.get((user_id, agent_name), []))[-limit:]

    def rewrite(self, user_id: str, agent_name: str | None, fn: RewriteFn) -> bool:
        key = (user_id, agent_name)
        with self.lock:
            current = self.documents.get(key)
            if current is None:
                return False
            result = fn(current.model_copy(deep=True), list(self.histories.get(key, [])))
            if result is None:
                return False
            self.documents[key] = result[0].model_copy(deep=True)
            self.histories[key] = list(result[1])
            return True

    def list_agents(self, user_id: str) -> list[str | None]:
        with self.lock:
            return [agent for user, agent in self.documents if user == user_id]

    def list_users(self) -> list[str]:
        with self.lock:
            return sorted({user for user, _ in self.documents})

    def delete(self, user_id: str, agent_name: str | None) -> bool:
        with self.lock:
            self.histories.pop((user_id, agent_name), None)
            return self.documents.pop((user_id, agent_name), None) is not None
