"""The one place that formats Redis key names.

Queue keys share a hash tag per shard (``{memq:0}``) so every key one Lua script touches sits in one
cluster slot. Memory-document keys are tagged per (user, agent) instead: they are only touched
together with their own lock and history.
"""

from __future__ import annotations

import zlib
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class QueueKeys:
    """Keys of one shard of the queue."""

    tag: str

    @property
    def due(self) -> str:
        return f"{self.tag}:due"

    @property
    def inflight(self) -> str:
        return f"{self.tag}:inflight"

    @property
    def dead(self) -> str:
        return f"{self.tag}:dead"

    @property
    def stats(self) -> str:
        return f"{self.tag}:stats"

    def context(self, context_id: str) -> str:
        return f"{self.tag}:ctx:{context_id}"

    def watermark(self, context_id: str) -> str:
        return f"{self.tag}:wm:{context_id}"

    def user_inflight(self, user_id: str) -> str:
        """Zset of one user's contexts in flight in this shard (id -> lease expiry): the per-user
        cap counts it, so one tenant's backlog cannot fill the broker ahead of everyone else."""
        return f"{self.tag}:uinflight:{user_id}"


@dataclass(frozen=True, slots=True)
class KeySchema:
    prefix: str = "memq"
    shards: int = 1

    def shard_of(self, context_id: str) -> int:
        if self.shards == 1:
            return 0
        return zlib.crc32(context_id.encode("utf-8")) % self.shards

    def shard(self, index: int) -> QueueKeys:
        return QueueKeys(tag=f"{self.prefix}:{{{self.prefix}:{index}}}")

    def for_context(self, context_id: str) -> QueueKeys:
        return self.shard(self.shard_of(context_id))

    def all_shards(self) -> list[QueueKeys]:
        return [self.shard(i) for i in range(self.shards)]

    # --- memory documents (RedisMemoryStorage)
    def _doc_tag(self, user_id: str, agent_name: str | None) -> str:
        return f"{self.prefix}:mem:{{{user_id}:{agent_name or ''}}}"

    def memory_document(self, user_id: str, agent_name: str | None) -> str:
        return f"{self._doc_tag(user_id, agent_name)}:doc"

    def memory_lock(self, user_id: str, agent_name: str | None) -> str:
        return f"{self._doc_tag(user_id, agent_name)}:lock"

    def memory_history(self, user_id: str, agent_name: str | None) -> str:
        return f"{self._doc_tag(user_id, agent_name)}:history"

    def memory_index(self) -> str:
        """Set of ``user:agent`` pairs that have a document (for listing and forget)."""
        return f"{self.prefix}:mem:index"

    def metrics(self) -> str:
        """Global counters (extractions, tokens) for `memq stats`."""
        return f"{self.prefix}:metrics"
