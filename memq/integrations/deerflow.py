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
- Management calls return DeerFlow's document shape and raise what the gateway maps: ``KeyError``
  404, ``ValueError("content" | "confidence" | "Duplicate fact")`` 400/409,
  ``MemoryConflictError`` 409, ``MemoryCorruptionError`` 500, ``OSError`` 500.
- ``clear_memory`` / ``delete_fact`` first take the (user, agent)'s pending and in-flight work out
  of the queue and fence runs in flight, so an extraction already running cannot bring back what
  the user just removed (DeerFlow #5093).

Agent names map one to one (DeerFlow's ``None`` — its ``__default__`` bucket — is memq's
user-global memory); a missing user id is DeerFlow's ``"default"``.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import math
from collections.abc import Iterator
from pathlib import Path
from typing import Any, ClassVar, Literal

import redis
from deerflow.agents.memory.manager import (
    MemoryConflictError,
    MemoryCorruptionError,
    MemoryManager,
)
from pydantic import PrivateAttr

from memq.core.connection import redis_client
from memq.core.errors import CorruptMemoryFile, FactEvicted, InvalidMemoryData, LockTimeout
from memq.core.identity import validate_agent_name, validate_user_id
from memq.core.settings import MemqSettings, load_settings, settings_values
from memq.integrations.deerflow_format import (
    KeepHidden,
    apply_hidden_filter,
    deerflow_document,
    deerflow_fact,
    with_user_summaries,
)
from producer.injector import MemoryInjector
from producer.producer import MemoryProducer
from prompts.injection import format_memory_for_injection
from prompts.tokens import make_token_counter
from storage import get_storage
from storage.document import MemoryDocument, empty_document
from storage.erasure import ALL_AGENTS, erase
from storage.management import DuplicateFact, valid_content
from storage.management import MemoryManager as FactManager
from storage.search import warm as warm_search

log = logging.getLogger(__name__)


class _DuplicateFact(MemoryConflictError, ValueError):
    """A fact with the same content exists: 409 at the gateway, an ``error`` for the tool."""


@contextlib.contextmanager
def _mapped_errors() -> Iterator[None]:
    """memq's errors as the ones DeerFlow's gateway maps to status codes."""
    try:
        yield
    except CorruptMemoryFile as exc:
        raise MemoryCorruptionError(str(exc)) from exc
    except LockTimeout as exc:
        raise MemoryConflictError(str(exc)) from exc
    except redis.RedisError as exc:
        raise OSError(f"memq: Redis error: {exc}") from exc


class MemqMemoryManager(MemoryManager):
    """DeerFlow ``MemoryManager`` backed by memq (Redis queue, Celery workers)."""

    supports_search: ClassVar[bool] = True

    _settings: Any = PrivateAttr(default=None)
    _redis: Any = PrivateAttr(default=None)
    _storage: Any = PrivateAttr(default=None)
    _producer: Any = PrivateAttr(default=None)
    _counter: Any = PrivateAttr(default=None)
    _keep_hidden: Any = PrivateAttr(default=None)

    def model_post_init(self, context: Any) -> None:
        values = settings_values(self.backend_config)
        if "storage_dir" not in self.backend_config and "storage_path" in self.backend_config:
            # DeerFlow's storage_path (its home, injected by the host) holds DeerFlow's own
            # users/{user}/memory.json: memq's files go beside them, never over them.
            values["storage_dir"] = Path(str(self.backend_config["storage_path"])) / "memq"
        ignored = sorted(set(values) - set(MemqSettings.model_fields))
        if ignored:
            # DeerMem's own knobs (model, patterns_dir, storage_class, …) mean nothing to memq.
            log.info("memq: backend_config keys without a memq setting, ignored: %s", ignored)
        settings = load_settings(**values)
        self._settings = settings
        self._redis = redis_client(settings, socket_timeout=3.0)
        self._storage = get_storage(settings, redis=self._redis)
        self._producer = MemoryProducer(settings)

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
        instance = cls(
            backend_config=dict(backend_config or {}),
            mode=mode,
            callbacks=host_hooks.get("callbacks"),
        )
        keep = host_hooks.get("should_keep_hidden_message")
        instance._keep_hidden = keep if callable(keep) else None
        return instance

    # --- helpers
    @property
    def settings(self) -> MemqSettings:
        settings: MemqSettings = self._settings
        return settings

    def _facts(self) -> FactManager:
        return FactManager(
            self._storage,
            max_facts=self.settings.max_facts,
            fact_max_chars=self.settings.fact_max_chars,
        )

    @staticmethod
    def _scope(user_id: str | None, agent_name: str | None) -> tuple[str, str | None]:
        return validate_user_id(user_id), validate_agent_name(agent_name)

    def _document(self, user: str, agent: str | None) -> dict[str, Any]:
        with _mapped_errors():
            return deerflow_document(self._storage.load(user, agent))

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
            thread_id, user_id, agent_name, apply_hidden_filter(messages, keep), trace_id=trace_id
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
        self._producer.flush(thread_id, user_id, agent_name, apply_hidden_filter(messages, keep))

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
        with _mapped_errors():
            document: MemoryDocument = self._storage.load(user, agent)
            if agent is not None:
                document = with_user_summaries(document, self._storage.load(user, None))
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
        with _mapped_errors():
            found = self._facts().search(
                user, query, agent_name=agent, category=category, limit=top_k
            )
        return [deerflow_fact(f) for f in found]

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
        with _mapped_errors():
            erase(self.settings, self._redis, self._storage, user, agent_name=agent)

    def clear_memory(
        self, *, user_id: str | None = None, agent_name: str | None = None
    ) -> dict[str, Any]:
        """``agent_name=None``: everything the user has (every agent and the user-level
        memory); an agent: only that agent's memory, the user-level summaries stay."""
        user, agent = self._scope(user_id, agent_name)
        with _mapped_errors():
            # Queued work first: deleting a context takes its claim, so a run in flight for
            # this user can no longer save and re-create what is cleared (DeerFlow #5093).
            erase(
                self.settings,
                self._redis,
                self._storage,
                user,
                agent_name=ALL_AGENTS if agent_name is None else agent,
            )
        return deerflow_document(empty_document())

    def import_memory(
        self,
        memory_data: dict[str, Any],
        *,
        user_id: str | None = None,
        agent_name: str | None = None,
    ) -> dict[str, Any]:
        user, agent = self._scope(user_id, agent_name)
        with _mapped_errors():
            return deerflow_document(
                self._facts().import_document(user, memory_data, agent_name=agent)
            )

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
        text = _content(content)
        number = _confidence(confidence)
        with _mapped_errors():
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
                raise _DuplicateFact("Duplicate fact") from None
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
        with _mapped_errors():
            self._facts().edit_fact(
                user,
                fact_id,
                agent_name=agent,
                content=None if content is None else _content(content),
                category=category,
                confidence=None if confidence is None else _confidence(confidence),
            )
            return self._document(user, agent)

    def delete_fact(
        self, fact_id: str, *, agent_name: str | None = None, user_id: str | None = None
    ) -> dict[str, Any]:
        user, agent = self._scope(user_id, agent_name)
        with _mapped_errors():
            document: MemoryDocument = self._storage.load(user, agent)
            if document.fact(fact_id) is None:
                raise KeyError(fact_id)
            # Pending work of this thread may still hold the sentence the fact came from; it
            # goes, so no extraction re-learns what the user just deleted.
            erase(
                self.settings, self._redis, self._storage, user, agent_name=agent, documents=False
            )
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
        """Load the token counter and the Chinese word segmenter, and check that Redis
        answers."""
        try:
            if self._counter is None:
                self._counter = make_token_counter(self.settings.token_counting)
            self._counter("warm up")
            warm_search()
            self._redis.ping()
        except Exception as exc:
            log.warning("memq: warm-up failed: %s", exc)
            return False
        return True

    def close(self) -> None:
        self._producer.close()
        self._redis.close()

    def injector(self) -> MemoryInjector:
        """memq's own injector on the same settings and storage (``<user_memory>`` block)."""
        return MemoryInjector(self.settings, self._storage)


def _content(value: object) -> str:
    try:
        return valid_content(value)
    except InvalidMemoryData:
        raise ValueError("content") from None


def _confidence(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError("confidence")
    number = float(value)
    if not math.isfinite(number) or not 0.0 <= number <= 1.0:
        raise ValueError("confidence")
    return number
