"""memq as DeerFlow's memory backend: ``memory.manager_class:
"memq.integrations.deerflow:MemqMemoryManager"``.

It subclasses DeerFlow's ``MemoryManager`` (imported here, so this module only loads inside a
DeerFlow process) and maps each call of the contract onto memq:

- ``add`` / ``add_nowait`` hand the run's messages to memq's producer (one Redis round trip,
  fail-open; ``add_nowait`` makes the context due at once). The extraction runs in memq's Celery
  workers, never in the gateway's threads, and the queue lives in Redis — so a restart loses
  nothing but what the producer spooled while Redis was away, which ``shutdown_flush`` hands over.
- ``get_context`` is the budgeted memory text without memq's wrapper (DeerFlow adds its own
  ``<memory>`` tag): the agent's facts plus the user-level summaries in middleware mode, the
  summaries alone in tool mode (facts stay behind ``search``).
- ``search`` is BM25 over English and Chinese words, confidence breaking ties.
- A read that fails (``get_context``, ``search``, ``warm``) raises DeerFlow's
  ``MemoryManagerError``, so its ``failure_policy.read: fail_closed`` sees the outage.
  ``get_context`` reads as memq's injector does (``injector_timeout_seconds``, then a
  skip-until back-off): a hung Redis costs one short wait, then nothing until it answers.
- The management calls (documents, facts, clear, import, agent deletion) map onto memq's memory
  manager and erasure. ``clear_memory`` / ``delete_fact`` / ``discard_pending_updates`` first take
  the (user, agent)'s pending and in-flight work out of the queue, which fences runs in flight, so
  an extraction already running cannot bring back what the user just removed (DeerFlow #5093).
  The settings, argument checks and error mapping are in ``deerflow_boundary``.

Agent names map one to one (DeerFlow's ``None`` — its ``__default__`` bucket — is memq's
user-global memory). DeerFlow's user without login, ``"default"`` (or no user id), is memq's
anonymous user, where ``memq import --deerflow`` puts DeerFlow's ``users/default`` memory.
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any, ClassVar, Literal

from deerflow.agents.memory.manager import MemoryManager
from pydantic import ConfigDict, PrivateAttr

from memq.core.connection import redis_client
from memq.core.errors import FactEvicted
from memq.core.identity import validate_agent_name, validate_user_id
from memq.core.settings import MemqSettings
from memq.integrations.deerflow_boundary import (
    DuplicateFactError,
    fact_confidence,
    fact_content,
    management_errors,
    read_errors,
    settings_for,
)
from memq.integrations.deerflow_import import from_deerflow_user
from memq.memory.deerflow_format import (
    KeepHidden,
    apply_hidden_filter,
    deerflow_document,
    deerflow_fact,
    with_user_summaries,
)
from memq.operations.service import memory_manager
from producer.injector import MemoryInjector
from producer.producer import MemoryProducer
from producer.query_embedding import query_embedder
from prompts.injection import format_memory_for_injection
from prompts.tokens import make_token_counter
from storage import get_storage
from storage.document import MemoryDocument, empty_document
from storage.erasure import ALL_AGENTS, ErasureReport, erase, erase_scripts
from storage.fact_input import DuplicateFact
from storage.location import check_reader
from storage.management import MemoryManager as FactManager
from storage.words import warm as warm_search

log = logging.getLogger(__name__)

_SETTINGS = "memq_settings"  # from_config hands its resolved settings to model_post_init


class MemqMemoryManager(MemoryManager):
    """DeerFlow ``MemoryManager`` backed by memq (Redis queue, Celery workers)."""

    supports_search: ClassVar[bool] = True

    _settings: Any = PrivateAttr(default=None)
    _redis: Any = PrivateAttr(default=None)
    _storage: Any = PrivateAttr(default=None)
    _erase_lua: Any = PrivateAttr(default=None)
    _producer: Any = PrivateAttr(default=None)
    _counter: Any = PrivateAttr(default=None)
    _keep_hidden: Any = PrivateAttr(default=None)
    _reader: Any = PrivateAttr(default=None)
    _manager: Any = PrivateAttr(default=None)

    # A construction error must not echo the backend_config (it may hold a Redis password).
    model_config = ConfigDict(hide_input_in_errors=True)

    def model_post_init(self, context: Any) -> None:
        given = context.get(_SETTINGS) if isinstance(context, dict) else None
        settings = given if isinstance(given, MemqSettings) else settings_for(self.backend_config)
        self._settings = settings
        self._redis = redis_client(settings, socket_timeout=3.0)
        self._storage = get_storage(settings, redis=self._redis)
        # One query embedder (None without MEMQ_EMBEDDING_MODEL) for search and the read.
        embedder = query_embedder(settings, self._redis)
        self._manager = memory_manager(settings, self._storage, embedder=embedder)
        self._erase_lua = erase_scripts(self._redis)
        self._producer = MemoryProducer(settings)
        # get_context runs before an agent's turn: memq's injector read, on its own client with
        # the short injector timeout and the skip-until back-off (strict: it raises, and
        # read_errors turns that into DeerFlow's MemoryManagerError).
        self._reader = MemoryInjector(settings, embedder=embedder)

    @classmethod
    def from_config(
        cls,
        backend_config: dict[str, Any] | None = None,
        *,
        mode: Literal["middleware", "tool"] = "middleware",
        **host_hooks: Any,
    ) -> MemqMemoryManager:
        """``backend_config`` holds memq settings by their names (``redis_url``, ``storage``,
        ``key_prefix``, …) or DeerFlow's (``max_injection_tokens``, ``storage_path``, …).

        Of the host hooks, ``should_keep_hidden_message`` is applied to the messages of ``add``;
        trace ids travel with each context to the worker's logs. ``callbacks`` (around the
        memory LLM call), ``host_llm_factory``, ``trace_context_manager`` and
        ``extraction_callback`` are not used: the LLM call runs in a memq worker process, with
        memq's own model settings.
        """
        config = dict(backend_config or {})
        # Resolved here first, so a bad folder is one plain line (``ValueError``) at startup.
        settings = settings_for(config)
        instance: MemqMemoryManager = cls.model_validate(
            {"backend_config": config, "mode": mode, "callbacks": host_hooks.get("callbacks")},
            context={_SETTINGS: settings},
        )
        keep = host_hooks.get("should_keep_hidden_message")
        instance._keep_hidden = keep if callable(keep) else None
        return instance

    @property
    def settings(self) -> MemqSettings:
        settings: MemqSettings = self._settings
        return settings

    # --- tier 1
    def add(
        self,
        thread_id: str,
        messages: list[Any],
        *,
        agent_name: str | None = None,
        user_id: str | None = None,
        trace_id: str | None = None,
    ) -> None:
        keep: KeepHidden | None = self._keep_hidden
        self._producer.after_agent(
            thread_id,
            from_deerflow_user(user_id),
            agent_name,
            apply_hidden_filter(messages, keep),
            trace_id=trace_id,
        )

    def add_nowait(
        self,
        thread_id: str,
        messages: list[Any],
        *,
        agent_name: str | None = None,
        user_id: str | None = None,
    ) -> None:
        keep: KeepHidden | None = self._keep_hidden
        self._producer.flush(
            thread_id, from_deerflow_user(user_id), agent_name, apply_hidden_filter(messages, keep)
        )

    def get_context(
        self,
        user_id: str | None,
        *,
        agent_name: str | None = None,
        thread_id: str | None = None,
    ) -> str:
        settings = self.settings
        if not (settings.enabled and settings.injection_enabled):
            return ""
        user, agent = self._scope(user_id, agent_name)
        reader: MemoryInjector = self._reader
        with read_errors("reading memory"):
            document: MemoryDocument = reader.load(user, agent)
            if agent is not None:
                document = with_user_summaries(document, reader.load(user, None))
        if self.mode == "tool":
            document = document.model_copy(update={"facts": []})
        if self._counter is None:
            self._counter = make_token_counter(settings.token_counting)
        return format_memory_for_injection(
            document,
            settings.injected_memory_max_tokens,
            guaranteed_categories=settings.guaranteed_categories,
            guaranteed_token_budget=settings.guaranteed_token_budget,
            count_tokens=self._counter,
        )

    # --- tier 2
    def search(
        self,
        query: str,
        top_k: int = 5,
        *,
        user_id: str | None = None,
        agent_name: str | None = None,
        category: str | None = None,
    ) -> list[dict[str, Any]]:
        if not query or not query.strip() or top_k <= 0:
            return []
        user, agent = self._scope(user_id, agent_name)
        with read_errors("searching memory"):
            found = self._facts().search(
                user, query, agent_name=agent, category=category, limit=top_k
            )
        return [deerflow_fact(f) for f in found]

    # --- management: the gateway's /api/memory routes, the memory tools, agent deletion
    def _erase(self, user: str, **options: Any) -> ErasureReport:
        """:func:`storage.erasure.erase` with the scripts this manager registered once."""
        return erase(
            self.settings, self._redis, self._storage, user, scripts=self._erase_lua, **options
        )

    def _facts(self) -> FactManager:
        facts: FactManager = self._manager
        return facts

    @staticmethod
    def _scope(user_id: str | None, agent_name: str | None) -> tuple[str, str | None]:
        """DeerFlow's (user, agent) as memq's, validated: its ``"default"`` user is memq's
        anonymous user, as the importer has it."""
        return validate_user_id(from_deerflow_user(user_id)), validate_agent_name(agent_name)

    def _load_scoped(self, user: str, agent: str | None) -> MemoryDocument:
        """The document of (user, agent), an agent's with the user-level summaries."""
        document: MemoryDocument = self._storage.load(user, agent)
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
            # ``{}`` empties the memory on purpose (DeerMem's contract); a file whose facts
            # cannot be read is still refused rather than taken for an empty memory.
            self._facts().import_document(user, data, agent_name=agent, replace=not memory_data)
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

    # --- the async boundary DeerFlow awaits on its event loop: Redis and file I/O go to a thread
    async def aadd(
        self,
        thread_id: str,
        messages: list[Any],
        *,
        agent_name: str | None = None,
        user_id: str | None = None,
        trace_id: str | None = None,
    ) -> None:
        await asyncio.to_thread(
            self.add,
            thread_id,
            messages,
            agent_name=agent_name,
            user_id=user_id,
            trace_id=trace_id,
        )

    async def aget_context(
        self,
        user_id: str | None,
        *,
        agent_name: str | None = None,
        thread_id: str | None = None,
    ) -> str:
        return await asyncio.to_thread(
            self.get_context, user_id, agent_name=agent_name, thread_id=thread_id
        )

    async def asearch(
        self,
        query: str,
        top_k: int = 5,
        *,
        user_id: str | None = None,
        agent_name: str | None = None,
        category: str | None = None,
    ) -> list[dict[str, Any]]:
        return await asyncio.to_thread(
            self.search, query, top_k, user_id=user_id, agent_name=agent_name, category=category
        )

    # --- lifecycle
    def shutdown_flush(self, timeout: float) -> bool:
        """Hand what the producer spooled (Redis was away) to Redis within ``timeout``; True
        only if all of it is in Redis. The queue itself is durable: nothing else to drain."""
        handed: bool = self._producer.hand_over(timeout)
        return handed

    def warm(self) -> bool:
        """Load the token counter and the Chinese word segmenter, check that Redis answers, and
        say (one warning line) when the workers store memory somewhere this gateway does not
        read. Redis not answering raises ``MemoryManagerError`` (DeerFlow logs it and starts)."""
        if self._counter is None:
            self._counter = make_token_counter(self.settings.token_counting)
        self._counter("warm up")
        warm_search()
        with read_errors("warm-up"):
            self._redis.ping()
        check_reader(self.settings, "DeerFlow backend", self._redis)
        return True

    def close(self) -> None:
        self._producer.close()
        self._reader.close()
        self._redis.close()

    def injector(self) -> MemoryInjector:
        """memq's own injector on the same settings and storage (``<user_memory>`` block)."""
        return MemoryInjector(self.settings, self._storage)
