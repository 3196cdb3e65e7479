"""The batch lane's side of the Redis contract: park a claimed run, gather parked runs into a
job, record the job, settle each answer or send it back to a synchronous run.

A context in the batch lane keeps its claim token (the job's fencing token, and its request's
custom id) but leaves ``inflight``: the lease reaper never brings it back while its job is out for
hours. It sits in ``batch:pending`` until a job takes it, then in ``batch:out`` until its answer is
settled (``batch_complete.lua``) or sent back (``batch_fallback.lua``). Each atomic step is one
script next to this module; see each file's header for its KEYS, ARGV and return codes.
"""

from __future__ import annotations

import uuid
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from memq.core.connection import RedisClient
from memq.core.keys import KeySchema, QueueKeys
from memq.core.metrics import BATCH_DEPTHS
from memq.core.scripts import AlsoQueue, LuaScripts, call_then
from memq.core.settings import MemqSettings
from worker.queue import CompleteResult

_SCRIPTS = ("batch_park", "batch_submit", "batch_complete", "batch_fallback", "batch_unlock")
# A job not finished this long after its window is lost to us: its contexts run synchronously.
LOST_SLACK_MS = 3_600_000
# A shard's batch lock: a cycle starts no new step after BATCH_CYCLE_SECONDS, and each step is one
# HTTP call of at most BATCH_HTTP_TIMEOUT_SECONDS (no retries: the next cycle is the retry) plus
# Redis work, so the lock outlives any cycle; a worker killed mid-cycle holds up its shard's lane
# (never loses it) for at most this long.
BATCH_HTTP_TIMEOUT_SECONDS = 60.0
BATCH_CYCLE_SECONDS = 60.0
BATCH_LOCK_MS = 180_000
_READ_BATCH = 1000  # ids read per pipelined call


def _text(value: Any) -> str:
    return value.decode("utf-8") if isinstance(value, bytes) else str(value)


def parked_with(fields: Mapping[str, Any], token: str) -> bool:
    """Whether a context is in the batch lane with ``token``: parked with it (``batch_token``)
    and still claimed by it (``claim_token``; a later claim supersedes the batch). The one
    Python reading of the rule ``includes/batch_lane.lua`` states for the scripts."""
    return bool(token) and _field(fields, "claim_token") == token == _field(fields, "batch_token")


def _field(fields: Mapping[str, Any], name: str) -> str | None:
    value = fields.get(name)
    return None if value is None else _text(value)


@dataclass(frozen=True, slots=True)
class Parked:
    """One context waiting in ``batch:pending`` for a job, with the request it will send."""

    context_id: str
    token: str
    request: str  # the chat completion body, JSON


@dataclass(frozen=True, slots=True)
class OutRequest:
    """One context out in a job: what its answer is settled against."""

    context_id: str
    token: str


class BatchQueue:
    """The batch lane's Redis operations on one client (scripts registered once)."""

    def __init__(self, settings: MemqSettings, client: RedisClient) -> None:
        self.settings = settings
        self.redis = client
        self.keys = KeySchema(settings.key_prefix, settings.shards)
        self._scripts = LuaScripts(client, "worker", _SCRIPTS)

    # --- the extract task
    def park(
        self,
        context_id: str,
        token: str,
        request: str,
        watermark: str | None,
        run: str,
        now: int,
    ) -> bool:
        """Hand a claimed run to the batch lane; False when the claim is no longer ours."""
        q = self.keys.for_context(context_id)
        raw = self._scripts["batch_park"](
            keys=[
                q.context(context_id),
                q.inflight,
                q.user_leases,
                q.batch_pending,
            ],
            args=[context_id, token, now, request, watermark or "", run],
        )
        return int(raw) == 1

    # --- gathering
    def gather(self, shard: QueueKeys, now: int) -> list[Parked]:
        """The parked runs of ``shard`` a job should take now, oldest first: up to
        ``llm_batch_max_requests`` once that many wait or the oldest has waited
        ``llm_batch_gather_seconds``; else none. Runs whose claim moved on are left out."""
        settings = self.settings
        limit = settings.llm_batch_max_requests
        oldest = self.redis.zrange(shard.batch_pending, 0, 0, withscores=True)
        if not oldest:
            return []
        waited = now - int(oldest[0][1])
        count = int(self.redis.zcard(shard.batch_pending))
        if count < limit and waited < int(settings.llm_batch_gather_seconds * 1000):
            return []
        ids = [_text(m) for m in self.redis.zrange(shard.batch_pending, 0, limit - 1)]
        pipe = self.redis.pipeline(transaction=False)
        for context_id in ids:
            pipe.hmget(
                shard.context(context_id),
                ["claim_token", "batch_token", "batch_request", "batch_id"],
            )
        parked = []
        for context_id, (claim, token, request, batch_id) in zip(ids, pipe.execute(), strict=True):
            fields = {"claim_token": claim, "batch_token": token}
            if token is not None and parked_with(fields, _text(token)):
                if request is not None and batch_id is None:
                    parked.append(Parked(context_id, _text(token), _text(request)))
            elif token is None:
                # Superseded by a claim (a flush) or forgotten: leaves `batch:pending`, in a
                # script that checks again (it may have been parked anew since the read).
                self.fallback(OutRequest(context_id, ""), "", now)
        return parked

    def submit(self, shard: QueueKeys, batch_id: str, parked: list[Parked], now: int) -> int:
        """Record job ``batch_id`` holding ``parked``; how many it now holds (0: poll nothing)."""
        keys = [shard.batch_pending, shard.batched, shard.batch_jobs, shard.batch_job(batch_id)]
        args: list[Any] = [
            batch_id,
            now + self.settings.llm_batch_window_ms + LOST_SLACK_MS,
            now + int(self.settings.llm_batch_poll_seconds * 1000),
            self.settings.llm_batch_window_ms + 2 * LOST_SLACK_MS,
        ]
        for item in parked:
            keys.append(shard.context(item.context_id))
            args += (item.context_id, item.token)
        return int(self._scripts["batch_submit"](keys=keys, args=args))

    # --- polling
    def jobs_due(self, shard: QueueKeys, now: int) -> list[str]:
        """Batch ids of ``shard`` whose next poll has come."""
        return [_text(m) for m in self.redis.zrangebyscore(shard.batch_jobs, "-inf", now)]

    def poll_later(self, shard: QueueKeys, batch_id: str, now: int) -> None:
        self.redis.zadd(
            shard.batch_jobs, {batch_id: now + int(self.settings.llm_batch_poll_seconds * 1000)}
        )

    def job_requests(self, shard: QueueKeys, batch_id: str) -> list[OutRequest]:
        """The requests of a job not settled yet (a request leaves the job when it is)."""
        raw = self.redis.hgetall(shard.batch_job(batch_id))
        return [OutRequest(_text(v), _text(k)) for k, v in raw.items()]

    def drop_job(self, shard: QueueKeys, batch_id: str) -> None:
        """Forget a job every request of which is settled."""
        pipe = self.redis.pipeline(transaction=False)
        pipe.zrem(shard.batch_jobs, batch_id)
        pipe.delete(shard.batch_job(batch_id))
        pipe.execute()

    def lost(self, shard: QueueKeys, now: int) -> list[tuple[OutRequest, str]]:
        """Contexts out in a job past its window and slack, with that job's id."""
        ids = [
            _text(m) for m in self.redis.zrangebyscore(shard.batched, "-inf", now, 0, _READ_BATCH)
        ]
        pipe = self.redis.pipeline(transaction=False)
        for context_id in ids:
            pipe.hmget(shard.context(context_id), ["batch_token", "batch_id"])
        found = []
        for context_id, (token, batch_id) in zip(ids, pipe.execute() if ids else [], strict=True):
            found.append((OutRequest(context_id, _text(token or "")), _text(batch_id or "")))
        return found

    # --- settling
    def complete(
        self,
        request: OutRequest,
        batch_id: str,
        watermark: str | None,
        now: int,
        also: AlsoQueue | None = None,
    ) -> CompleteResult:
        """``also``: commands sent after the script in its round trip (:func:`call_then`)."""
        q = self.keys.for_context(request.context_id)
        raw = call_then(
            self.redis,
            self._scripts["batch_complete"],
            [
                q.context(request.context_id),
                q.batched,
                q.due,
                q.watermark(request.context_id),
                q.batch_job(batch_id),
                q.inflight,
                q.user_leases,
                q.batch_pending,
                q.claims,
            ],
            [
                request.context_id,
                request.token,
                now,
                watermark or "",
                self.settings.watermark_ttl_ms,
            ],
            also,
        )
        return CompleteResult(int(raw))

    def fallback(self, request: OutRequest, batch_id: str, now: int) -> bool:
        """Send a context back to a synchronous run, due now; False when its claim moved on."""
        q = self.keys.for_context(request.context_id)
        raw = self._scripts["batch_fallback"](
            keys=[
                q.context(request.context_id),
                q.batched,
                q.batch_pending,
                q.due,
                q.batch_job(batch_id),
                q.inflight,
                q.user_leases,
                q.claims,
            ],
            args=[request.context_id, request.token, now],
        )
        return int(raw) == 1

    # --- coordination and observing
    def lock(self, shard: QueueKeys, ttl_ms: int) -> str | None:
        """Take the shard's batch lock (one gatherer and poller at a time); its token, or None."""
        token = uuid.uuid4().hex
        return token if self.redis.set(shard.batch_lock, token, nx=True, px=ttl_ms) else None

    def unlock(self, shard: QueueKeys, token: str) -> None:
        self._scripts["batch_unlock"](keys=[shard.batch_lock], args=[token])

    def has_work(self, now: int) -> bool:
        """Whether any shard has parked runs or a job to poll or a lost context: one pipeline,
        so the ticker sends the batch task only when it has something to do."""
        pipe = self.redis.pipeline(transaction=False)
        for shard in self.keys.all_shards():
            pipe.zcard(shard.batch_pending)
            pipe.zcount(shard.batch_jobs, "-inf", now)
            pipe.zcount(shard.batched, "-inf", now)
        return any(int(n) for n in pipe.execute())

    def depths(self) -> dict[str, int]:
        """Contexts parked for a job, out in one, and jobs out, over every shard (the depths
        `memq stats` shows, named in :data:`memq.core.metrics.BATCH_DEPTHS`)."""
        pipe = self.redis.pipeline(transaction=False)
        shards = self.keys.all_shards()
        for shard in shards:
            for depth in BATCH_DEPTHS:
                pipe.zcard(depth.key(shard))
        replies = [int(n) for n in pipe.execute()]
        width = len(BATCH_DEPTHS)
        return {d.name: sum(replies[i::width]) for i, d in enumerate(BATCH_DEPTHS)}
