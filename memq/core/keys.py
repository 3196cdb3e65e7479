"""The one place that formats Redis key names.

Queue keys share a hash tag per shard (``{memq:0}``) so every key one Lua script touches sits in one
cluster slot. With several shards each tag is chosen by its slot (see :func:`shard_tag`) so the
shards spread evenly over a cluster's masters. A context's shard is a function of its (user,
agent) alone, and that (user, agent)'s memory document lives under the same tag: the save script
can then check the claim of the context it extracts (fencing) in the same atomic step as the
write, on one node or a cluster.
"""

from __future__ import annotations

import binascii
import functools
import itertools
import zlib
from dataclasses import dataclass

from memq.core.identity import (
    decode_agent,
    decode_user,
    encode_agent,
    encode_segment,
    encode_user,
)

CLUSTER_SLOTS = 16384
_TAG_WINDOW = 8  # slots either side of a shard's ideal slot


def key_slot(tag: str) -> int:
    """The Redis Cluster slot of a hash tag's content (CRC16/XMODEM mod 16384, as Redis does)."""
    return binascii.crc_hqx(tag.encode("utf-8"), 0) % CLUSTER_SLOTS


@functools.lru_cache(maxsize=8192)
def shard_tag(prefix: str, shards: int, index: int) -> str:
    """The hash-tag content of shard ``index`` of ``shards``: a pure function of its arguments,
    so every process names the same keys.

    One shard keeps the plain ``prefix:0``. With more, shard i gets the first ``prefix:i:n``
    (n = 0, 1, …) whose slot lies within 8 slots of the middle of the i-th of ``shards`` equal
    slot ranges: the shards sit on evenly spaced slots, so a cluster whose masters own equal
    contiguous slot ranges (as redis-cli and managed services assign them) gets an equal share
    (±1) of shards on each master. Naive tags (``prefix:0``, ``prefix:1``, …) hash where they
    hash: 4 of 6 landed on one master. About a thousand CRC16s per shard, once per process.
    """
    if shards == 1:
        return f"{prefix}:{index}"
    low, high = index * CLUSTER_SLOTS // shards, (index + 1) * CLUSTER_SLOTS // shards
    middle = (low + high) // 2
    low, high = max(low, middle - _TAG_WINDOW), min(high, middle + _TAG_WINDOW + 1)
    for n in itertools.count():
        candidate = f"{prefix}:{index}:{n}"
        if low <= key_slot(candidate) < high:
            return candidate
    raise AssertionError("unreachable")  # itertools.count() never ends


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

    def context(self, context_id: str) -> str:
        return f"{self.context_prefix}{context_id}"

    @property
    def context_prefix(self) -> str:
        """What every context hash's key starts with: claim_due.lua names its candidates' hashes
        from it (prefix .. id), so the claim sends no key per candidate."""
        return f"{self.tag}:ctx:"

    def watermark(self, context_id: str) -> str:
        return f"{self.tag}:wm:{context_id}"

    @property
    def epoch(self) -> str:
        """Counter of claims in this shard: every claim token is the next value, so a newer claim
        of a context always carries a larger number (the fencing order)."""
        return f"{self.tag}:epoch"

    def user_contexts(self, user_id: str) -> str:
        """Set of one user's context ids in this shard, kept by enqueue, so erasing a user finds
        every pending, in-flight and dead context without scanning the keyspace."""
        return f"{self.tag}:uctx:{encode_user(user_id)}"

    @property
    def user_leases(self) -> str:
        """Hash of each user's live leases in this shard (user key part -> how many of the
        user's contexts are in ``inflight``; ``~<user key part>`` -> the user's deferral
        horizon): the per-user cap reads it, so one tenant's backlog cannot fill the broker ahead
        of everyone else. One hash per shard, not a key per user: a claim then reads and writes
        every user's count in one call each (includes/leave_lease.lua keeps it)."""
        return f"{self.tag}:uleases"

    @property
    def claims(self) -> str:
        """Hash of the live claims in this shard (context id -> the claim token that holds it):
        the fence every run, save and settlement is checked against. claim_due.lua writes every
        claim of a call in one HSET, so a claim touches no key per candidate; a context's hash
        gets its run's fields when the run starts (worker/renew.lua). An id keeps its entry
        while it waits in the batch lane; includes/release_claim.lua removes it."""
        return f"{self.tag}:claims"

    # --- the batch lane: contexts whose extraction goes out in a provider's batch job
    @property
    def batch_pending(self) -> str:
        """Zset of contexts parked for the next batch job (id -> time parked, epoch ms)."""
        return f"{self.tag}:batch:pending"

    @property
    def batched(self) -> str:
        """Zset of contexts out in a batch job (id -> time past which the job counts as lost)."""
        return f"{self.tag}:batch:out"

    @property
    def batch_jobs(self) -> str:
        """Zset of this shard's batch jobs out (batch id -> next poll, epoch ms)."""
        return f"{self.tag}:batch:jobs"

    def batch_job(self, batch_id: str) -> str:
        """Hash of one batch job: claim token (the request's custom id) -> context id."""
        return f"{self.tag}:batch:job:{encode_segment(batch_id)}"

    @property
    def batch_lock(self) -> str:
        """Held while one process gathers or polls this shard's batch jobs (SET NX PX)."""
        return f"{self.tag}:batch:lock"


@dataclass(frozen=True, slots=True)
class KeySchema:
    prefix: str = "memq"
    shards: int = 1

    def shard_of(self, context_id: str) -> int:
        """The shard of a context id: that of its (user, agent) (the thread does not count)."""
        if self.shards == 1:
            return 0
        parts = context_id.split(":")
        if len(parts) != 3:  # not one of ours; still needs a stable place
            return zlib.crc32(context_id.encode("utf-8")) % self.shards
        return self._shard_of_parts(parts[1], parts[2])

    def shard_for(self, user_id: str, agent_name: str | None) -> int:
        if self.shards == 1:
            return 0
        return self._shard_of_parts(encode_user(user_id), encode_agent(agent_name))

    def _shard_of_parts(self, user_part: str, agent_part: str) -> int:
        # Hashes the encoded parts, as a context id holds them: ids that were valid before real
        # ids were accepted encode to themselves and keep their shard.
        return zlib.crc32(f"{user_part}:{agent_part}".encode()) % self.shards

    def shard(self, index: int) -> QueueKeys:
        return QueueKeys(tag=f"{self.prefix}:{{{shard_tag(self.prefix, self.shards, index)}}}")

    def for_context(self, context_id: str) -> QueueKeys:
        return self.shard(self.shard_of(context_id))

    def all_shards(self) -> list[QueueKeys]:
        return [self.shard(i) for i in range(self.shards)]

    # --- memory documents (RedisMemoryStorage), under the shard tag of their contexts
    def _doc_base(self, user_id: str, agent_name: str | None) -> str:
        # Encoded user ids and agent names never hold ":" or braces, so this is unambiguous and
        # the shard tag is the key's only hash tag.
        tag = self.shard(self.shard_for(user_id, agent_name)).tag
        return f"{tag}:mem:{self.index_member(user_id, agent_name)}"

    def memory_document(self, user_id: str, agent_name: str | None) -> str:
        return f"{self._doc_base(user_id, agent_name)}:doc"

    def memory_history(self, user_id: str, agent_name: str | None) -> str:
        return f"{self._doc_base(user_id, agent_name)}:history"

    def memory_index(self) -> str:
        """Set of ``user:agent`` pairs that have a document (for listing and forget)."""
        return f"{self.prefix}:mem:index"

    @staticmethod
    def index_member(user_id: str, agent_name: str | None) -> str:
        """The ``user:agent`` member of :meth:`memory_index` (both parts encoded)."""
        return f"{encode_user(user_id)}:{encode_agent(agent_name)}"

    @staticmethod
    def parse_index_member(member: str) -> tuple[str, str | None]:
        """(user, agent) of an index member; InvalidIdentifier for one memq did not write."""
        user, _, agent = member.partition(":")
        return decode_user(user), decode_agent(agent)

    def metrics(self) -> str:
        """Global counters (extractions, tokens) for `memq stats`."""
        return f"{self.prefix}:metrics"

    def token_budget(self, window: int, tenant: str) -> str:
        """Tokens spent in budget window ``window`` by ``tenant`` (an opaque hash of a user id, or
        ``*`` for the whole deployment)."""
        return f"{self.prefix}:budget:{window}:{tenant}"

    def rate_limit(self, scope: str) -> str:
        """Hash of the shared LLM rate limit of one (endpoint, model) ``scope`` (an opaque hash):
        its request and token schedules and any pause the provider asked for."""
        return f"{self.prefix}:rate:{{{self.prefix}:{scope}}}"

    def storage_location(self) -> str:
        """Where the workers of this prefix store memory documents (backend and folder), written
        by each worker at start, so a reader configured for another place can say so."""
        return f"{self.prefix}:workers:storage"
