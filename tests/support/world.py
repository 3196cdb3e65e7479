"""A queue and a storage on one Redis (a server or a cluster), with the producer's own enqueue
client, on a fixed clock (``T0``): the world of the erasure and cluster tests."""

from __future__ import annotations

import json
from typing import Any

from memq.core.connection import RedisClient
from memq.core.identity import ContextKey
from memq.core.keys import KeySchema
from memq.core.settings import MemqSettings
from producer.enqueue import Enqueuer, EnqueueRequest, EnqueueResult
from storage import get_storage
from storage.document import Fact, MemoryDocument
from tests.support.started_queue import StartingQueue

T0 = 1_700_000_000_000


class World:
    def __init__(self, settings: MemqSettings, client: RedisClient) -> None:
        self.settings, self.client = settings, client
        self.queue = StartingQueue(settings, client)
        self.storage = get_storage(settings, redis=client)
        self._enqueue = Enqueuer(
            client,
            KeySchema(settings.key_prefix, settings.shards),
            debounce_ms=settings.debounce_ms,
            max_delay_ms=settings.max_delay_ms,
            retention_ms=settings.context_retention_ms,
        )

    def hand_off(
        self,
        thread: str,
        user: str,
        text: str,
        *,
        agent: str | None = None,
        flush: bool = False,
        now: int = T0,
    ) -> EnqueueResult:
        """One turn (``text`` and an "ok"), as the producer enqueues it."""
        key = ContextKey.create(thread, user, agent)
        turn = [{"role": "user", "content": text}, {"role": "assistant", "content": "ok"}]
        return self._enqueue(
            EnqueueRequest(key=key, messages_json=json.dumps(turn), flush=flush), now
        )

    def enqueue(self, thread: str, user: str, text: str, **how: Any) -> str:
        """:meth:`hand_off`, answering the context's id."""
        return self.hand_off(thread, user, text, **how).context_id

    def remember(self, user: str, text: str, agent: str | None = None) -> None:
        self.storage.save(user, agent, MemoryDocument(facts=[Fact(content=text)]))
