"""What a person (or the CLI, or a tool) does to memory by hand, on any backend.

Every write goes through the storage's atomic ``update`` and records its change in the history in
the same critical section, so a hand edit never races an extraction (DeerFlow's REST edits could be
overwritten by a running update) and every edit can be traced afterwards. Import and clear
replace the whole document, so they fall back to an unconditional ``save`` when the stored one is
corrupt: an operator can always repair a document with them.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from memq.core.errors import CorruptMemoryFile, FactEvicted, FactNotFound, InvalidMemoryData
from memq.core.identity import validate_agent_name, validate_user_id
from storage.base import Change, MemoryStorage, UpdateFn, UpdateResult
from storage.cap import DEFAULT_FACT_MAX_CHARS, cap_facts_length
from storage.document import Fact, MemoryDocument, SupersededFact, empty_document, said_within
from storage.fact_input import (
    append_capped,
    parse_import,
    refuse_duplicate,
    refuse_too_long,
    refuse_unfit_import,
    valid_category,
    valid_confidence,
    valid_content,
)
from storage.provenance import FactExplanation, explain
from storage.search import Meaning, QueryEmbedding, meaning_for, search_facts
from storage.vocabulary import DEFAULT_CATEGORY

log = logging.getLogger(__name__)

_WHOLE_HISTORY = 1_000_000  # history is bounded by history_max_entries: read all of it


def ranked(facts: list[Fact]) -> list[Fact]:
    """Highest confidence first, document order among equals."""
    return sorted(facts, key=lambda f: -f.confidence)


class MemoryManager:
    """Fact CRUD, search, export/import, clear and forget over a :class:`MemoryStorage`.

    ``agent_name=None`` is the user-global memory throughout. ``max_facts`` is the fact cap
    ``add_fact`` applies (pass ``settings.max_facts``); None leaves documents uncapped.
    ``fact_max_chars`` (pass ``settings.fact_max_chars``) is the longest fact: refused when added
    or edited by hand, cut (and counted) on import. ``embedder`` (the recall-time query embedder,
    ``producer.query_embedding.query_embedder(settings)``) makes search rank by meaning too.
    """

    def __init__(
        self,
        storage: MemoryStorage,
        *,
        max_facts: int | None = None,
        fact_max_chars: int = DEFAULT_FACT_MAX_CHARS,
        embedder: QueryEmbedding | None = None,
    ) -> None:
        if max_facts is not None and max_facts < 1:
            raise InvalidMemoryData(f"max_facts must be at least 1, got {max_facts}")
        if fact_max_chars < 2:
            raise InvalidMemoryData(f"fact_max_chars must be at least 2, got {fact_max_chars}")
        self.storage = storage
        self.max_facts = max_facts
        self.fact_max_chars = fact_max_chars
        self.embedder = embedder

    # --- reading
    def document(self, user_id: str, *, agent_name: str | None = None) -> MemoryDocument:
        return self.storage.load(user_id, agent_name)

    def list_facts(
        self, user_id: str, *, agent_name: str | None = None, category: str | None = None
    ) -> list[Fact]:
        facts = self.storage.load(user_id, agent_name).facts
        if category is not None:
            facts = [f for f in facts if f.category == category.strip()]
        return ranked(facts)

    def search(
        self,
        user_id: str,
        query: str,
        *,
        agent_name: str | None = None,
        category: str | None = None,
        limit: int = 10,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[Fact]:
        """The ``limit`` facts most relevant to ``query`` (BM25 over English and Chinese words,
        fused with meaning when an embedder is set; confidence breaking ties); ``category`` and
        the time window (``since``/``until``: when the fact was said, :func:`said_within`) filter
        before the cut."""
        if not query.strip() or limit <= 0:
            return []
        document = self.storage.load(user_id, agent_name)
        return search_facts(
            said_within(document.facts, since, until),
            query,
            top_k=limit,
            category=category,
            meaning=self.meaning(document, query),
        )

    def meaning(self, document: MemoryDocument, query: str) -> Meaning | None:
        """The query's meaning against ``document``'s vectors, or None (no embedder, or it fell
        back within its timeout: rank by words)."""
        if self.embedder is None or not query.strip():
            return None
        return meaning_for(document.embeddings, self.embedder.model, self.embedder.embed(query))

    def history(
        self, user_id: str, *, agent_name: str | None = None, limit: int = 100
    ) -> list[Change]:
        """Recorded changes, newest first."""
        return self.storage.history(user_id, agent_name, limit=limit)

    def why(self, user_id: str, fact_id: str, *, agent_name: str | None = None) -> FactExplanation:
        """A fact's sources, confirmations and whole change history, including what it
        superseded and what superseded it (the fact may be current, superseded, or gone)."""
        document = self.storage.load(user_id, agent_name)
        history = list(reversed(self.storage.history(user_id, agent_name, limit=_WHOLE_HISTORY)))
        explanation = explain(document, history, fact_id)
        if explanation is None:
            raise FactNotFound(f"Memory fact {fact_id!r} not found.")
        return explanation

    def superseded(self, user_id: str, *, agent_name: str | None = None) -> list[SupersededFact]:
        """Facts that stopped being valid (contradicted or stale), newest first; never injected."""
        return list(reversed(self.storage.load(user_id, agent_name).superseded))

    def list_users(self) -> list[str]:
        return self.storage.list_users()

    def list_agents(self, user_id: str) -> list[str | None]:
        return self.storage.list_agents(user_id)

    # --- facts
    def add_fact(
        self,
        user_id: str,
        content: str,
        *,
        agent_name: str | None = None,
        category: str | None = DEFAULT_CATEGORY,
        confidence: float = 0.5,
        source_error: str | None = None,
        reject_duplicate: bool = False,
    ) -> Fact:
        """Append a fact, then apply the fact cap as an extraction would.

        Raises :class:`FactEvicted` when the cap evicted the new fact itself (every stored fact
        ranks above it); other facts the cap evicted are recorded in the history as ``evict``.
        With ``reject_duplicate`` a fact whose content is already stored (case-folded) raises
        :class:`DuplicateFact`, checked inside the same atomic update as the add.
        """
        max_facts = self.max_facts
        fact = Fact(
            content=valid_content(content),
            category=valid_category(category),
            confidence=valid_confidence(confidence),
            source="manual",
            source_error=source_error,
        )
        refuse_too_long(fact, self.fact_max_chars)
        kept: list[bool] = [True]

        def add(document: MemoryDocument) -> UpdateResult:
            if reject_duplicate:
                refuse_duplicate(document, fact)
            result, kept[0] = append_capped(document, fact, max_facts)
            return result

        self.storage.update(user_id, agent_name, add)
        if not kept[0]:
            raise FactEvicted(
                f"fact not kept: the memory is at its cap of {max_facts} facts and every stored "
                f"fact has a higher confidence than {fact.confidence:g} (or is a correction)"
            )
        return fact

    def edit_fact(
        self,
        user_id: str,
        fact_id: str,
        *,
        agent_name: str | None = None,
        content: str | None = None,
        category: str | None = None,
        confidence: float | None = None,
    ) -> Fact:
        """Change only the given fields; ``created_at`` and ``source`` are kept."""
        updates: dict[str, Any] = {}
        if content is not None:
            updates["content"] = valid_content(content)
        if category is not None:
            updates["category"] = valid_category(category)
        if confidence is not None:
            updates["confidence"] = valid_confidence(confidence)
        edited: list[Fact] = []

        def edit(document: MemoryDocument) -> UpdateResult:
            fact = self._find(document, fact_id)
            refuse_too_long(fact.model_copy(update=updates), self.fact_max_chars)
            for name, value in updates.items():
                setattr(fact, name, value)
            edited[:] = [fact.model_copy()]
            fields = ", ".join(sorted(updates)) or "nothing"
            change = Change(
                action="edit", fact_id=fact.id, content=fact.content, reason=f"edited {fields}"
            )
            return UpdateResult(document, [change])

        self.storage.update(user_id, agent_name, edit)
        return edited[-1]

    def delete_fact(self, user_id: str, fact_id: str, *, agent_name: str | None = None) -> Fact:
        removed: list[Fact] = []

        def delete(document: MemoryDocument) -> UpdateResult:
            fact = self._find(document, fact_id)
            document.facts = [f for f in document.facts if f.id != fact_id]
            removed[:] = [fact]
            change = Change(
                action="remove", fact_id=fact.id, content=fact.content, reason="deleted by hand"
            )
            return UpdateResult(document, [change])

        self.storage.update(user_id, agent_name, delete)
        return removed[-1]

    # --- whole documents
    def export(self, user_id: str, *, agent_name: str | None = None) -> dict[str, Any]:
        """The memq memory.json of that (user, agent), its fact vectors included (an import
        then needs no re-embedding for the texts it keeps)."""
        return self.storage.load(user_id, agent_name).to_json(vectors=True)

    def import_document(
        self,
        user_id: str,
        data: Mapping[str, Any] | str | bytes,
        *,
        agent_name: str | None = None,
        replace: bool = False,
    ) -> MemoryDocument:
        """Replace the document with an imported DeerFlow or memq memory.json. Refused (nothing
        written) above ``max_facts`` facts, or with no readable fact unless ``replace`` says
        emptying the memory is meant."""
        return self.import_document_counted(user_id, data, agent_name=agent_name, replace=replace)[
            0
        ]

    def import_document_counted(
        self,
        user_id: str,
        data: Mapping[str, Any] | str | bytes,
        *,
        agent_name: str | None = None,
        replace: bool = False,
    ) -> tuple[MemoryDocument, int]:
        """:meth:`import_document`, and how many facts were cut to ``fact_max_chars``."""
        if isinstance(data, str | bytes):
            try:
                data = json.loads(data)
            except ValueError as exc:
                raise InvalidMemoryData(f"not JSON: {exc}") from exc
        imported = parse_import(data)
        entries = data.get("facts") if isinstance(data, Mapping) else None
        refuse_unfit_import(
            imported,
            len(entries) if isinstance(entries, list) else 0,
            max_facts=self.max_facts,
            replace=replace,
        )
        imported.facts, cut = cap_facts_length(imported.facts, self.fact_max_chars)
        reason = f"imported {len(imported.facts)} facts"
        if cut:
            reason += f", {cut} cut to {self.fact_max_chars} characters"
            log.info("import: %d over-long fact(s) cut to %d characters", cut, self.fact_max_chars)
        change = Change(action="import", reason=reason)
        document = self._replace(
            user_id, agent_name, lambda _current: UpdateResult(imported, [change]), imported, change
        )
        return document, cut

    def clear(self, user_id: str, *, agent_name: str | None = None) -> int:
        """Empty the document (history kept, with the clear recorded); returns facts removed."""
        count: list[int] = [0]

        def clear(document: MemoryDocument) -> UpdateResult:
            count[0] = len(document.facts)
            change = Change(action="clear", reason=f"cleared {count[0]} facts")
            return UpdateResult(empty_document(), [change])

        fallback = Change(action="clear", reason="cleared a corrupt document")
        self._replace(user_id, agent_name, clear, empty_document(), fallback)
        return count[0]

    def forget(self, user_id: str) -> int:
        """Delete every memory of that user — each agent's and the global one, history included.
        Returns how many documents were removed."""
        user = validate_user_id(user_id)
        targets = {validate_agent_name(a) for a in self.storage.list_agents(user)} | {None}
        return sum(self.storage.delete(user, agent) for agent in targets)

    def _replace(
        self,
        user_id: str,
        agent_name: str | None,
        fn: UpdateFn,
        document: MemoryDocument,
        change: Change,
    ) -> MemoryDocument:
        """Replace the whole document: atomically through ``update`` (so the file backend moves a
        corrupt file aside, keeping it for forensics), or — when the stored document is corrupt —
        with an unconditional ``save`` that records ``change`` in the same critical section."""
        try:
            return self.storage.update(user_id, agent_name, fn)
        except CorruptMemoryFile as exc:
            log.warning("replacing a corrupt memory document (%s): %s", change.action, exc)
            self.storage.save(user_id, agent_name, document, changes=[change])
            return self.storage.load(user_id, agent_name)

    @staticmethod
    def _find(document: MemoryDocument, fact_id: str) -> Fact:
        fact = document.fact(fact_id)
        if fact is None:
            raise FactNotFound(f"Memory fact {fact_id!r} not found.")
        return fact
