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
- The management calls (documents, facts, clear, import, agent deletion) are in
  ``deerflow_manage``; the settings, argument checks and error mapping in ``deerflow_boundary``.

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
from memq.core.settings import MemqSettings
from memq.deerflow_import import from_deerflow_user
from memq.integrations.deerflow_boundary import read_errors, settings_for
from memq.integrations.deerflow_format import (
    KeepHidden,
    apply_hidden_filter,
    deerflow_fact,
    with_user_summaries,
)
from memq.integrations.deerflow_manage import ManagementCalls
from producer.injector import MemoryInjector
from producer.producer import MemoryProducer
from prompts.injection import format_memory_for_injection
from prompts.tokens import make_token_counter
from storage import get_storage
from storage.document import MemoryDocument
from storage.location import check_reader
from storage.search import warm as warm_search

log = logging.getLogger(__name__)

_SETTINGS = "memq_settings"  # from_config hands its resolved settings to model_post_init


class MemqMemoryManager(ManagementCalls, MemoryManager):
    """DeerFlow ``MemoryManager`` backed by memq (Redis queue, Celery workers)."""

    supports_search: ClassVar[bool] = True

    _settings: Any = PrivateAttr(default=None)
    _redis: Any = PrivateAttr(default=None)
    _storage: Any = PrivateAttr(default=None)
    _producer: Any = PrivateAttr(default=None)
    _counter: Any = PrivateAttr(default=None)
    _keep_hidden: Any = PrivateAttr(default=None)
    _reader: Any = PrivateAttr(default=None)

    # A construction error must not echo the backend_config (it may hold a Redis password).
    model_config = ConfigDict(hide_input_in_errors=True)

    def model_post_init(self, context: Any) -> None:
        given = context.get(_SETTINGS) if isinstance(context, dict) else None
        settings = given if isinstance(given, MemqSettings) else settings_for(self.backend_config)
        self._settings = settings
        self._redis = redis_client(settings, socket_timeout=3.0)
        self._storage = get_storage(
            settings, redis=self._redis if settings.storage == "redis" else None
        )
        self._producer = MemoryProducer(settings)
        # get_context runs before an agent's turn: memq's injector read, on its own client with
        # the short injector timeout and the skip-until back-off (strict: it raises, and
        # read_errors turns that into DeerFlow's MemoryManagerError).
        self._reader = MemoryInjector(settings)

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
