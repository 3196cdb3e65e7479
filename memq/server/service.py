"""What the server's routes and MCP tools share: one producer, one injector per token budget,
the memory manager and the queue client, built once from the settings the app factory got.

Nothing here decides a rule of memory: a hand-off is the producer's, a block the injector's, a
fact edit the manager's, a forget :func:`storage.erasure.erase`'s, a dead letter the queue
client's. This module only wires them and says how a hand-off ended.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from memq.core.errors import RedisUnavailable
from memq.core.settings import MemqSettings
from producer.injector import MemoryInjector
from producer.producer import MemoryProducer
from storage import get_storage
from storage.erasure import ErasureReport, erase
from storage.management import MemoryManager

if TYPE_CHECKING:
    from memq.core.connection import RedisClient
    from storage.base import MemoryStorage
    from worker.queue import QueueClient

HandOffStatus = Literal["queued", "spooled", "nothing_to_remember"]
# Distinct budgets kept as injectors (each holds a token counter); more reuse the default one.
_MAX_INJECTORS = 32
_STORAGE_TIMEOUT_SECONDS = 3.0


@dataclass(frozen=True, slots=True)
class HandOffOutcome:
    status: HandOffStatus
    context_id: str | None = None
    version: int | None = None
    deadline_ms: int | None = None


class MemqService:
    """The server's handles on memq; ``close`` at shutdown hands the spool to Redis."""

    def __init__(self, settings: MemqSettings, *, redis: RedisClient | None = None) -> None:
        from memq.core.connection import redis_client

        self.settings = settings
        self._owns_redis = redis is None
        self.redis = (
            redis
            if redis is not None
            else redis_client(settings, socket_timeout=_STORAGE_TIMEOUT_SECONDS)
        )
        self.storage: MemoryStorage = get_storage(
            settings, redis=self.redis if settings.storage == "redis" else None
        )
        # Its own client with the producer's short timeouts: a hand-off costs one round trip.
        self.producer = MemoryProducer(settings)
        self.manager = MemoryManager(self.storage, max_facts=settings.max_facts)
        self._injectors: dict[int, MemoryInjector] = {}
        self._lock = threading.Lock()
        self._queue: QueueClient | None = None

    # --- hand-off
    def hand_off(
        self,
        thread_id: str,
        user_id: str,
        agent_name: str | None,
        messages: Sequence[Any],
        *,
        flush: bool,
        trace_id: str | None,
    ) -> HandOffOutcome:
        """Queue a conversation; when Redis does not answer, the producer's spool keeps it and
        replays it once Redis is back. Bad input raises (InvalidIdentifier, InvalidMessages)."""
        try:
            result = self.producer.enqueue(
                thread_id, user_id, agent_name, messages, flush=flush, trace_id=trace_id
            )
        except RedisUnavailable:
            # The fail-open variant spools what the strict one could not send (or sends it, if
            # Redis came back meanwhile).
            submit = self.producer.flush if flush else self.producer.after_agent
            taken = submit(thread_id, user_id, agent_name, messages, trace_id=trace_id)
            return HandOffOutcome("queued" if taken else "spooled")
        if result is None:
            return HandOffOutcome("nothing_to_remember")
        return HandOffOutcome("queued", result.context_id, result.version, result.deadline_ms)

    # --- reading
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
                    injector = MemoryInjector(settings, self.storage)
                    self._injectors[budget] = injector
            return injector

    def block(
        self, user_id: str, agent_name: str | None, *, query: str | None, max_tokens: int | None
    ) -> str:
        return self.injector(max_tokens).block(user_id, agent_name, query=query)

    # --- operations
    @property
    def queue(self) -> QueueClient:
        with self._lock:
            if self._queue is None:
                from worker.queue import QueueClient

                self._queue = QueueClient(self.settings, self.redis)
            return self._queue

    def forget(self, user_id: str) -> ErasureReport:
        return erase(self.settings, self.redis, self.storage, user_id)

    def close(self) -> None:
        self.producer.close()
        if self._owns_redis:
            self.redis.close()
