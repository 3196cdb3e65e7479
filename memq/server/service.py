"""What the server's routes and MCP tools share: one producer, one injector per token budget,
the memory manager and the queue client, built once from the settings the app factory got.

Nothing here decides a rule of memory: a hand-off is the producer's, a block the injector's, a
fact edit the manager's, a forget :func:`storage.erasure.erase`'s (or ``erase_thread``'s), a
dead letter the queue client's. This module only wires them and says how a hand-off ended.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Literal

from memq.core.errors import RedisUnavailable
from memq.core.identity import ContextKey
from memq.core.settings import MemqSettings
from producer.enqueue import build_request
from producer.injector import MemoryInjector
from producer.producer import MemoryProducer
from producer.query_embedding import query_embedder
from storage import get_storage
from storage.erasure import ErasureReport, ThreadErasureReport, erase, erase_thread
from storage.management import MemoryManager

if TYPE_CHECKING:
    from memq.core.connection import RedisClient
    from storage.base import MemoryStorage
    from worker.queue import QueueClient

HandOffStatus = Literal["queued", "spooled", "nothing_to_remember"]
# Distinct budgets kept as injectors (each holds a token counter); more reuse the default one.
_MAX_INJECTORS = 32
_STORAGE_TIMEOUT_SECONDS = 3.0
# After the strict enqueue met an unreachable Redis, hand-offs take the fail-open path this long.
_STRICT_BACKOFF_SECONDS = 1.0


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
        self.storage: MemoryStorage = get_storage(settings, redis=self.redis)
        # The agent-facing read (the block before a turn): its own client with the injector's
        # short timeout, as in an agent process (the injector backs off and fails open past it).
        self._read_redis = redis_client(settings, socket_timeout=settings.injector_timeout_seconds)
        self._read_storage = get_storage(settings, redis=self._read_redis)
        # Its own client with the producer's short timeouts: a hand-off costs one round trip.
        self.producer = MemoryProducer(settings)
        # One query embedder (None without MEMQ_EMBEDDING_MODEL) for every recall of this server.
        self.embedder = query_embedder(settings, self._read_redis)
        self.manager = MemoryManager(
            self.storage, max_facts=settings.max_facts, embedder=self.embedder
        )
        self._injectors: dict[int, MemoryInjector] = {}
        self._lock = threading.Lock()
        self._queue: QueueClient | None = None
        self._strict_after = 0.0  # time.monotonic() before which a hand-off goes fail-open

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
        if time.monotonic() < self._strict_after:
            return self._fail_open(thread_id, user_id, agent_name, messages, flush, trace_id)
        try:
            result = self.producer.enqueue(
                thread_id, user_id, agent_name, messages, flush=flush, trace_id=trace_id
            )
        except RedisUnavailable:
            # The strict call keeps no back-off of its own: for a while, go straight to the
            # fail-open one, which skips a Redis that just failed (one timeout per back-off,
            # not one per request, while Redis hangs).
            self._strict_after = time.monotonic() + _STRICT_BACKOFF_SECONDS
            submit = self.producer.flush if flush else self.producer.after_agent
            taken = submit(thread_id, user_id, agent_name, messages, trace_id=trace_id)
            return HandOffOutcome("queued" if taken else "spooled")
        if result is None:
            return HandOffOutcome("nothing_to_remember")
        return HandOffOutcome("queued", result.context_id, result.version, result.deadline_ms)

    def _fail_open(
        self,
        thread_id: str,
        user_id: str,
        agent_name: str | None,
        messages: Sequence[Any],
        flush: bool,
        trace_id: str | None,
    ) -> HandOffOutcome:
        """While Redis recently failed: the producer's own request builder says whether the
        input is valid and worth sending (its errors are the strict call's), then the fail-open
        call queues or spools it."""
        if not self.settings.enabled:
            return HandOffOutcome("nothing_to_remember")
        request = build_request(
            ContextKey.create(thread_id, user_id, agent_name),
            messages,
            flush=flush,
            trace_id=trace_id,
            max_chars=self.settings.producer_max_chars,
            max_messages=self.settings.producer_max_messages,
            max_bytes=self.settings.context_max_bytes,
        )
        if request is None:
            return HandOffOutcome("nothing_to_remember")
        submit = self.producer.flush if flush else self.producer.after_agent
        taken = submit(thread_id, user_id, agent_name, messages, trace_id=trace_id)
        if taken:
            self._strict_after = 0.0
        return HandOffOutcome("queued" if taken else "spooled", request.context_id)

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
                    injector = MemoryInjector(settings, self._read_storage, embedder=self.embedder)
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

    def forget_thread(self, user_id: str, thread_id: str) -> ThreadErasureReport:
        """Forget one thread of a user in every agent's memory (`memq forget USER --thread T`):
        the one door the HTTP API and the inspector share."""
        return erase_thread(self.settings, self.redis, self.storage, user_id, thread_id)

    def close(self) -> None:
        self.producer.close()
        if self.embedder is not None:
            self.embedder.close()
        self._read_redis.close()
        if self._owns_redis:
            self.redis.close()
