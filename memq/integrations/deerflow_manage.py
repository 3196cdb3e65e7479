"""The management half of memq's DeerFlow backend: what the gateway's ``/api/memory`` routes, the
memory tools and agent deletion call (documents, facts, clear, import, erase).

Documents come in DeerFlow's shape with facts newest first; an agent's document shows the
user-level summaries (DeerFlow keeps them once per user, beside every agent's facts).
``clear_memory`` / ``delete_fact`` / ``discard_pending_updates`` first take the (user, agent)'s
pending and in-flight work out of the queue, which fences runs in flight, so an extraction
already running cannot bring back what the user just removed (DeerFlow #5093).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from memq.core.errors import FactEvicted
from memq.core.identity import validate_agent_name, validate_user_id
from memq.deerflow_import import from_deerflow_user
from memq.integrations.deerflow_boundary import (
    DuplicateFactError,
    fact_confidence,
    fact_content,
    management_errors,
)
from memq.integrations.deerflow_format import deerflow_document, with_user_summaries
from storage.document import MemoryDocument, empty_document
from storage.erasure import ALL_AGENTS, ErasureReport, erase
from storage.fact_input import DuplicateFact
from storage.management import MemoryManager as FactManager

if TYPE_CHECKING:
    from memq.core.connection import RedisClient
    from memq.core.scripts import LuaScripts
    from memq.core.settings import MemqSettings
    from producer.injector import MemoryInjector
    from storage.base import MemoryStorage


class ManagementCalls:
    """Mixed into ``MemqMemoryManager`` ahead of DeerFlow's base, whose defaults raise
    ``NotImplementedError`` (HTTP 501)."""

    if TYPE_CHECKING:
        _redis: RedisClient
        _storage: MemoryStorage
        _erase_lua: LuaScripts
        _reader: MemoryInjector

        @property
        def settings(self) -> MemqSettings: ...

    def _erase(self, user: str, **options: Any) -> ErasureReport:
        """:func:`storage.erasure.erase` with the scripts this manager registered once."""
        return erase(
            self.settings, self._redis, self._storage, user, scripts=self._erase_lua, **options
        )

    def _facts(self) -> FactManager:
        return FactManager(
            self._storage,
            max_facts=self.settings.max_facts,
            fact_max_chars=self.settings.fact_max_chars,
            embedder=self._reader.embedder(),
        )

    @staticmethod
    def _scope(user_id: str | None, agent_name: str | None) -> tuple[str, str | None]:
        """DeerFlow's (user, agent) as memq's, validated: its ``"default"`` user is memq's
        anonymous user, as the importer has it."""
        return validate_user_id(from_deerflow_user(user_id)), validate_agent_name(agent_name)

    def _load_scoped(self, user: str, agent: str | None) -> MemoryDocument:
        """The document of (user, agent), an agent's with the user-level summaries."""
        document = self._storage.load(user, agent)
        if agent is not None:
            document = with_user_summaries(document, self._storage.load(user, None))
        return document

    def _document(self, user: str, agent: str | None) -> dict[str, Any]:
        with management_errors():
            return deerflow_document(self._load_scoped(user, agent))

    def get_memory(
        self, *, user_id: str | None = None, agent_name: str | None = None
    ) -> dict[str, Any]:
        return self._document(*self._scope(user_id, agent_name))

    def reload_memory(
        self, *, user_id: str | None = None, agent_name: str | None = None
    ) -> dict[str, Any]:
        # memq's stores re-read on every load (the file cache is checked against the file).
        return self.get_memory(user_id=user_id, agent_name=agent_name)

    def export_memory(
        self, *, user_id: str | None = None, agent_name: str | None = None
    ) -> dict[str, Any]:
        return self.get_memory(user_id=user_id, agent_name=agent_name)

    def delete_memory(self, *, user_id: str | None = None, agent_name: str | None = None) -> None:
        user, agent = self._scope(user_id, agent_name)
        with management_errors():
            self._erase(user, agent_name=agent)

    def discard_pending_updates(self, *, user_id: str | None, agent_name: str | None) -> int:
        """DeerFlow's hook on agent deletion (probed with ``getattr``): the agent's queued work
        (pending, in flight — fenced —, dead, watermarks) and its memory go, so a new agent of
        the same name starts empty. Without an agent name only the user-level queued work goes
        (the user-level memory is not an agent's to delete). Returns the contexts discarded."""
        user, agent = self._scope(user_id, agent_name)
        with management_errors():
            report = self._erase(user, agent_name=agent, documents=agent is not None)
        return report.pending + report.in_flight + report.dead

    def clear_memory(
        self, *, user_id: str | None = None, agent_name: str | None = None
    ) -> dict[str, Any]:
        """``agent_name=None``: everything the user has (every agent and the user-level
        memory); an agent: only that agent's memory, the user-level summaries stay (and are in
        the document returned)."""
        user, agent = self._scope(user_id, agent_name)
        with management_errors():
            # Queued work first: deleting a context takes its claim, so a run in flight for
            # this user can no longer save and re-create what is cleared (DeerFlow #5093).
            self._erase(user, agent_name=ALL_AGENTS if agent_name is None else agent)
        if agent_name is None:
            return deerflow_document(empty_document())
        return self._document(user, agent)

    def import_memory(
        self,
        memory_data: dict[str, Any],
        *,
        user_id: str | None = None,
        agent_name: str | None = None,
    ) -> dict[str, Any]:
        """Replace the document; ``{}`` is an empty memory (as DeerMem takes it)."""
        user, agent = self._scope(user_id, agent_name)
        data = memory_data if memory_data else deerflow_document(empty_document())
        with management_errors():
            self._facts().import_document(user, data, agent_name=agent)
        return self._document(user, agent)

    def create_fact(
        self,
        content: str,
        category: str = "context",
        confidence: float = 0.5,
        *,
        agent_name: str | None = None,
        user_id: str | None = None,
    ) -> tuple[dict[str, Any], str | None]:
        user, agent = self._scope(user_id, agent_name)
        text = fact_content(content)
        number = fact_confidence(confidence)
        with management_errors():
            try:
                # The duplicate check runs inside the add's atomic update (DeerFlow #4599).
                fact = self._facts().add_fact(
                    user,
                    text,
                    agent_name=agent,
                    category=category,
                    confidence=number,
                    reject_duplicate=True,
                )
            except DuplicateFact:
                raise DuplicateFactError("Duplicate fact") from None
            except FactEvicted:
                return self._document(user, agent), None
        return self._document(user, agent), fact.id

    def update_fact(
        self,
        fact_id: str,
        content: str | None = None,
        category: str | None = None,
        confidence: float | None = None,
        *,
        agent_name: str | None = None,
        user_id: str | None = None,
    ) -> dict[str, Any]:
        user, agent = self._scope(user_id, agent_name)
        with management_errors():
            self._facts().edit_fact(
                user,
                fact_id,
                agent_name=agent,
                content=None if content is None else fact_content(content),
                category=category,
                confidence=None if confidence is None else fact_confidence(confidence),
            )
        return self._document(user, agent)

    def delete_fact(
        self, fact_id: str, *, agent_name: str | None = None, user_id: str | None = None
    ) -> dict[str, Any]:
        user, agent = self._scope(user_id, agent_name)
        with management_errors():
            if self._storage.load(user, agent).fact(fact_id) is None:
                raise KeyError(fact_id)
            # Pending work of this thread may still hold the sentence the fact came from; it
            # goes, so no extraction re-learns what the user just deleted.
            self._erase(user, agent_name=agent, documents=False)
            self._facts().delete_fact(user, fact_id, agent_name=agent)
        return self._document(user, agent)
