"""The queue-side half of a fenced save for storages that do not live in Redis.

The file storage asks, under its document lock and right before writing, whether the claim a run
holds is still the context's current one. The Redis storage needs none of this: its save script
reads the claim token itself, in the same atomic step.
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

from memq.core.keys import KeySchema
from memq.core.settings import MemqSettings
from storage.base import Fence

if TYPE_CHECKING:
    from memq.core.connection import RedisClient


class RedisClaimCheck:
    """``check(fence)`` → True while ``fence.token`` is the context's claim token.

    Without a client one is built from the settings at the first check: a storage that only
    serves reads and hand edits never connects, and a fenced save is always checked."""

    def __init__(self, settings: MemqSettings, client: RedisClient | None = None) -> None:
        self._settings = settings
        self._keys = KeySchema(settings.key_prefix, settings.shards)
        self._redis = client
        self._lock = threading.Lock()

    def _client(self) -> RedisClient:
        with self._lock:
            if self._redis is None:
                from memq.core.connection import redis_client

                self._redis = redis_client(self._settings)
            return self._redis

    def __call__(self, fence: Fence) -> bool:
        key = self._keys.for_context(fence.context_id).context(fence.context_id)
        return self._client().hget(key, "claim_token") == fence.token
