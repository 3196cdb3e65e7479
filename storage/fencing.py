"""The queue-side half of a fenced save for storages that do not live in Redis.

The file storage asks, under its document lock and right before writing, whether the claim a run
holds is still the context's current one. The Redis storage needs none of this: its save script
reads the claim token itself, in the same atomic step.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from memq.core.keys import KeySchema
from memq.core.settings import MemqSettings
from storage.base import Fence

if TYPE_CHECKING:
    from memq.core.connection import RedisClient


class RedisClaimCheck:
    """``check(fence)`` → True while ``fence.token`` is the context's claim token."""

    def __init__(self, settings: MemqSettings, client: RedisClient) -> None:
        self._keys = KeySchema(settings.key_prefix, settings.shards)
        self._redis = client

    def __call__(self, fence: Fence) -> bool:
        key = self._keys.for_context(fence.context_id).context(fence.context_id)
        current = self._redis.hget(key, "claim_token")
        if isinstance(current, bytes):
            current = current.decode("utf-8")
        return current == fence.token
