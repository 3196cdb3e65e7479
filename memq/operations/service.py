"""Every operation a door offers, once: :class:`MemqService` holds memq's handles (built once from
the settings) and checks each call against the operation table before it runs.

Nothing here decides a rule of memory: a hand-off is the producer's, a block the injector's, a
fact edit the memory manager's, a forget :func:`storage.erasure.erase`'s, a dead letter the queue
client's. This module gives each a name, a scope, its caps and its typed errors, the same for the
HTTP API, MCP, the inspector, the CLI and the integrations.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any, Literal

from memq.core.errors import InvalidMemoryData
from memq.core.settings import MemqSettings
from memq.memory.deerflow_format import deerflow_document
from memq.operations.access import Principal
from memq.operations.caps import MAX_DEAD_IDS, check_count
from memq.operations.table import authorize
from producer.injector import MemoryInjector
from producer.producer import MemoryProducer, Offered
from producer.query_embedding import query_embedder
from prompts.injection import Injection
from storage import get_storage
from storage.erasure import ALL_AGENTS, ErasureReport, ThreadErasureReport, erase, erase_thread
from storage.management import MemoryManager
from storage.vocabulary import check_category

if TYPE_CHECKING:
    from memq.core.connection import RedisClient
    from storage.base import Change, MemoryStorage
    from storage.document import Fact, MemoryDocument, SupersededFact
    from storage.provenance import FactExplanation
    from storage.search import QueryEmbedding
    from worker.queue import DeadEntry, QueueClient

# Distinct budgets kept as injectors (each holds a token counter); more reuse the default one.
_MAX_INJECTORS = 32
# Reads and writes by hand (management, the inspector): longer than an agent's hand-off, still
# bounded, so a hung Redis answers 503 instead of holding a request thread.
STORAGE_TIMEOUT_SECONDS = 3.0
ExportFormat = Literal["memq", "deerflow"]


def memory_manager(
    settings: MemqSettings, storage: MemoryStorage, *, embedder: QueryEmbedding | None = None
) -> MemoryManager:
    """The one way a door builds its memory manager: the configured fact cap and fact length,
    and the query embedder its search ranks by meaning with (``query_embedder(settings)``)."""
    return MemoryManager(
        storage,
        max_facts=settings.max_facts,
        fact_max_chars=settings.fact_max_chars,
        embedder=embedder,
    )


class MemqService:
    """memq's handles for one process of doors; ``close`` at shutdown hands the spool to Redis.

    Each public method is one operation of :mod:`memq.operations.table` and takes the caller
    first: a door passes the principal its key, session or connection resolved to (the CLI and
    in-process integrations pass :data:`memq.operations.access.LOCAL`).
    """

    def __init__(
        self,
        settings: MemqSettings,
        *,
        redis: RedisClient | None = None,
        keep_in_memory: bool = True,
    ) -> None:
        """``keep_in_memory``: whether a turn Redis did not take may wait in this process's
        spool when it is not on disk (a server that lives on); False for a process that may end
        any time (MCP over stdio): without a disk spool its caller is told the turn was not
        kept."""
        from memq.core.connection import redis_client

        self.settings = settings
        self._keep_in_memory = keep_in_memory
        self._owns_redis = redis is None
        self.redis = (
            redis
            if redis is not None
            else redis_client(settings, socket_timeout=STORAGE_TIMEOUT_SECONDS)
        )
        self.storage: MemoryStorage = get_storage(settings, redis=self.redis)
        # The agent-facing read (the block before a turn): its own client with the injector's
        # short timeout, as in an agent process (the injector backs off and fails open past it).
        self._read_redis = redis_client(settings, socket_timeout=settings.injector_timeout_seconds)
        self._read_storage = get_storage(settings, redis=self._read_redis)
        # Its own client with the producer's short timeouts: a hand-off costs one round trip,
        # and the producer's back-off is the only one (a hung Redis costs one timeout).
        self.producer = MemoryProducer(settings)
        # One query embedder (None without MEMQ_EMBEDDING_MODEL) for every recall of this process.
        self.embedder = query_embedder(settings, self._read_redis)
        self.manager = memory_manager(settings, self.storage, embedder=self.embedder)
        self._injectors: dict[int, MemoryInjector] = {}
        self._lock = threading.Lock()
        self._queue: QueueClient | None = None

    # --- around each turn
    def hand_off(
        self,
        who: Principal,
        user_id: str,
        agent_name: str | None,
        thread_id: str,
        messages: Sequence[Any],
        *,
        flush: bool = False,
        trace_id: str | None = None,
    ) -> Offered:
        """Queue a conversation; when Redis does not answer, the producer's spool keeps it and
        replays it once Redis is back. Bad input raises (InvalidIdentifier, InvalidMessages)."""
        authorize(who, "hand_off", user_id)
        check_count(messages, self.settings.producer_max_messages, "messages")
        return self.producer.offer(
            thread_id,
            user_id,
            agent_name,
            messages,
            flush=flush,
            trace_id=trace_id,
            keep_in_memory=self._keep_in_memory,
        )

    def injector(self, max_tokens: int | None) -> MemoryInjector:
        budget = max_tokens or self.settings.injected_memory_max_tokens
        with self._lock:
            injector = self._injectors.get(budget)
            if injector is None:
                if len(self._injectors) >= _MAX_INJECTORS:
                    budget = self.settings.injected_memory_max_tokens
                    injector = self._injectors.get(budget)
                if injector is None:
                    settings = self.settings.model_copy(
                        update={"injected_memory_max_tokens": budget}
                    )
                    injector = MemoryInjector(settings, self._read_storage, embedder=self.embedder)
                    self._injectors[budget] = injector
            return injector

    def recall(
        self,
        who: Principal,
        user_id: str,
        agent_name: str | None,
        *,
        query: str | None = None,
        max_tokens: int | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        strict: bool = False,
    ) -> str:
        """The ``<user_memory>`` block (``""`` when nothing is known or Redis does not answer:
        the injector fails open, as before an agent's turn); ``since``/``until``: only facts said
        within that window; ``strict``: an outage raises, for a tool that must not pass it off
        as "nothing known"."""
        authorize(who, "recall", user_id)
        return self.injector(max_tokens).block(
            user_id, agent_name, query=query, since=since, until=until, strict=strict
        )

    def recall_plan(
        self,
        who: Principal,
        user_id: str,
        agent_name: str | None,
        *,
        query: str | None = None,
        max_tokens: int | None = None,
    ) -> Injection:
        """What :meth:`recall` decides, with the facts it left out and why (the preview);
        raises when the memory cannot be read."""
        authorize(who, "recall", user_id)
        return self.injector(max_tokens).plan(user_id, agent_name, query=query, explain=True)

    # --- reading a memory
    def document(self, who: Principal, user_id: str, agent_name: str | None) -> MemoryDocument:
        authorize(who, "read_memory", user_id)
        return self.manager.document(user_id, agent_name=agent_name)

    def list_facts(
        self,
        who: Principal,
        user_id: str,
        agent_name: str | None,
        *,
        category: str | None = None,
    ) -> list[Fact]:
        authorize(who, "read_memory", user_id)
        return self.manager.list_facts(user_id, agent_name=agent_name, category=category)

    def search(
        self,
        who: Principal,
        user_id: str,
        agent_name: str | None,
        query: str,
        *,
        category: str | None = None,
        limit: int = 10,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> list[Fact]:
        authorize(who, "search", user_id)
        return self.manager.search(
            user_id,
            query,
            agent_name=agent_name,
            category=category,
            limit=limit,
            since=since,
            until=until,
        )

    def why(
        self, who: Principal, user_id: str, agent_name: str | None, fact_id: str
    ) -> FactExplanation:
        authorize(who, "why", user_id)
        return self.manager.why(user_id, fact_id, agent_name=agent_name)

    def history(
        self, who: Principal, user_id: str, agent_name: str | None, *, limit: int = 100
    ) -> list[Change]:
        authorize(who, "history", user_id)
        return self.manager.history(user_id, agent_name=agent_name, limit=limit)

    def superseded(
        self, who: Principal, user_id: str, agent_name: str | None
    ) -> list[SupersededFact]:
        authorize(who, "superseded", user_id)
        return self.manager.superseded(user_id, agent_name=agent_name)

    def list_users(self, who: Principal) -> list[str]:
        """The users with a memory, only those the caller's key reaches."""
        authorize(who, "list_users")
        return [user for user in self.manager.list_users() if who.reaches(user)]

    def list_agents(self, who: Principal, user_id: str) -> list[str | None]:
        authorize(who, "read_memory", user_id)
        return self.manager.list_agents(user_id)

    # --- changing a memory by hand
    def add_fact(
        self,
        who: Principal,
        user_id: str,
        agent_name: str | None,
        content: str,
        *,
        category: str,
        confidence: float,
    ) -> Fact:
        """Held to the fact cap and the fact length an extraction is (FactEvicted, FactTooLong);
        the category must be one extraction knows."""
        authorize(who, "add_fact", user_id)
        return self.manager.add_fact(
            user_id,
            content,
            agent_name=agent_name,
            category=check_category(category),
            confidence=confidence,
        )

    def edit_fact(
        self,
        who: Principal,
        user_id: str,
        agent_name: str | None,
        fact_id: str,
        *,
        content: str | None = None,
        category: str | None = None,
        confidence: float | None = None,
    ) -> Fact:
        authorize(who, "edit_fact", user_id)
        return self.manager.edit_fact(
            user_id,
            fact_id,
            agent_name=agent_name,
            content=content,
            category=None if category is None else check_category(category),
            confidence=confidence,
            by=who.name,
        )

    def delete_fact(
        self, who: Principal, user_id: str, agent_name: str | None, fact_id: str
    ) -> Fact:
        authorize(who, "delete_fact", user_id)
        return self.manager.delete_fact(user_id, fact_id, agent_name=agent_name, by=who.name)

    def restore_fact(
        self, who: Principal, user_id: str, agent_name: str | None, fact_id: str
    ) -> Fact:
        authorize(who, "restore_fact", user_id)
        return self.manager.restore_fact(user_id, fact_id, agent_name=agent_name, by=who.name)

    def never_learn(
        self, who: Principal, user_id: str, agent_name: str | None, fact_id: str
    ) -> Fact:
        """Delete the fact and keep it on the memory's do-not-learn list."""
        authorize(who, "never_learn", user_id)
        return self.manager.forget_fact(user_id, fact_id, agent_name=agent_name, by=who.name)

    def block(self, who: Principal, user_id: str, agent_name: str | None, content: str) -> None:
        authorize(who, "edit_do_not_learn", user_id)
        self.manager.block(user_id, content, agent_name=agent_name, by=who.name)

    def unblock(self, who: Principal, user_id: str, agent_name: str | None, content: str) -> None:
        authorize(who, "edit_do_not_learn", user_id)
        self.manager.unblock(user_id, content, agent_name=agent_name, by=who.name)

    def edit_summary(
        self, who: Principal, user_id: str, agent_name: str | None, section: str, summary: str
    ) -> None:
        authorize(who, "edit_summary", user_id)
        self.manager.edit_summary(user_id, section, summary, agent_name=agent_name, by=who.name)

    def export(
        self,
        who: Principal,
        user_id: str,
        agent_name: str | None,
        *,
        format: ExportFormat = "memq",
    ) -> dict[str, Any]:
        authorize(who, "export", user_id)
        if format == "deerflow":
            return deerflow_document(self.manager.document(user_id, agent_name=agent_name))
        return self.manager.export(user_id, agent_name=agent_name)

    def import_document(
        self,
        who: Principal,
        user_id: str,
        agent_name: str | None,
        data: Mapping[str, Any] | str | bytes,
        *,
        replace: bool = False,
    ) -> tuple[MemoryDocument, int]:
        """Replace the memory with an imported memq or DeerFlow document, held to the fact cap
        and fact length (refused above the cap, or with no readable fact unless ``replace``);
        answers the document and how many facts were cut to length."""
        authorize(who, "import", user_id)
        return self.manager.import_document_counted(
            user_id, data, agent_name=agent_name, replace=replace
        )

    # --- forgetting
    def forget_user(self, who: Principal, user_id: str) -> ErasureReport:
        authorize(who, "forget_user", user_id)
        return erase(self.settings, self.redis, self.storage, user_id, agent_name=ALL_AGENTS)

    def forget_agent(self, who: Principal, user_id: str, agent_name: str | None) -> ErasureReport:
        authorize(who, "forget_agent", user_id)
        return erase(self.settings, self.redis, self.storage, user_id, agent_name=agent_name)

    def forget_thread(self, who: Principal, user_id: str, thread_id: str) -> ThreadErasureReport:
        """Forget one thread of a user in every agent's memory, fenced like a whole user."""
        authorize(who, "forget_thread", user_id)
        return erase_thread(self.settings, self.redis, self.storage, user_id, thread_id)

    # --- the queue
    @property
    def queue(self) -> QueueClient:
        with self._lock:
            if self._queue is None:
                from worker.queue import QueueClient

                self._queue = QueueClient(self.settings, self.redis)
            return self._queue

    def stats(self, who: Principal) -> dict[str, Any]:
        """What `memq stats --json` prints: depths, lag, outcomes, tokens and the bill."""
        from memq.core.clock import now_ms
        from memq.core.metrics import read_snapshot, summarise

        authorize(who, "stats")
        return summarise(read_snapshot(self.redis, self.settings, now_ms()))

    def dead_letters(self, who: Principal, *, limit: int = 1000) -> list[DeadEntry]:
        authorize(who, "dead_letters")
        return self.queue.dead_list(limit)

    def retry_dead(self, who: Principal, ids: Iterable[str] | Literal["all"]) -> int:
        authorize(who, "retry_dead")
        return self.queue.dead_retry(_dead_ids(ids))

    def purge_dead(self, who: Principal, ids: Iterable[str] | Literal["all"]) -> int:
        authorize(who, "purge_dead")
        return self.queue.dead_purge(_dead_ids(ids))

    def close(self) -> None:
        self.producer.close()
        if self.embedder is not None:
            self.embedder.close()
        self._read_redis.close()
        if self._owns_redis:
            self.redis.close()


def _dead_ids(ids: Iterable[str] | Literal["all"]) -> list[str] | Literal["all"]:
    if ids == "all":
        return "all"
    chosen = list(ids)
    if not chosen:
        raise InvalidMemoryData("no dead letter chosen")
    check_count(chosen, MAX_DEAD_IDS, "ids")
    return chosen
