"""The world of the erasure tests: a queue and a storage on one redis-server, with the
producer's own enqueue client, on a fixed clock (``T0``)."""

from __future__ import annotations

import redis

from memq.core.identity import ContextKey
from memq.core.keys import KeySchema
from memq.core.settings import MemqSettings
from producer.enqueue import Enqueuer, EnqueueRequest
from storage import get_storage
from storage.document import Fact, MemoryDocument
from worker.queue import QueueClient

T0 = 1_700_000_000_000


class World:
    """A queue and a storage on one redis-server, with the producer's own enqueue client."""

    def __init__(self, settings: MemqSettings, client: redis.Redis) -> None:
        self.settings, self.client = settings, client
        self.queue = QueueClient(settings, client)
        self.storage = get_storage(settings, redis=client)
        self._enqueue = Enqueuer(
            client,
            KeySchema(settings.key_prefix, settings.shards),
            debounce_ms=settings.debounce_ms,
            max_delay_ms=settings.max_delay_ms,
            retention_ms=settings.context_retention_ms,
        )

    def enqueue(
        self,
        thread: str,
        user: str,
        text: str,
        *,
        agent: str | None = None,
        flush: bool = False,
        now: int = T0,
    ) -> str:
        key = ContextKey.create(thread, user, agent)
        messages = f'[{{"role":"user","content":"{text}"}},{{"role":"assistant","content":"ok"}}]'
        self._enqueue(EnqueueRequest(key=key, messages_json=messages, flush=flush), now)
        return key.id

    def remember(self, user: str, text: str, agent: str | None = None) -> None:
        self.storage.save(user, agent, MemoryDocument(facts=[Fact(content=text)]))
