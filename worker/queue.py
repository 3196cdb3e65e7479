"""Every worker-side Redis operation on the queue: claim, reap, complete, fail, renew, dead letters.

Each atomic operation is one Lua script next to this module (see each file's header for its KEYS,
ARGV and return codes), assembled with its shared fragments (``includes/``) by
:mod:`memq.core.scripts`. Scripts return small codes; they are mapped to Enums here, once.
"""

from __future__ import annotations

import logging
import math
from collections.abc import Iterable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any, Literal, NamedTuple, cast

import redis
from redis.exceptions import NoScriptError

from memq.core.clock import now_ms
from memq.core.connection import RedisClient
from memq.core.keys import KeySchema, QueueKeys
from memq.core.metrics import MetricsRecorder, read_snapshot, summarise
from memq.core.scripts import AlsoQueue, AlsoRead, LuaScripts, call_then
from memq.core.settings import MemqSettings
from worker.shard_reads import dead_batches, due_members, script_per_shard

log = logging.getLogger("memq.queue")

_SCRIPTS = (
    "claim_due",
    "reap_expired",
    "complete",
    "fail",
    "renew",
    "release",
    "defer",
    "dead_retry",
    "dead_purge",
)
_PERMANENT = "-1"  # fail.lua's retry_at_ms meaning "dead at once"
_DEAD_BATCH = 500  # ids per dead_retry/dead_purge script call
_SCRIPT_BATCH = 500  # ids per reap_expired script call


class CompleteResult(Enum):
    STALE = 0
    DONE = 1
    RESCHEDULED = 2


class FailResult(Enum):
    STALE = 0
    RETRY = 1
    DEAD = 2


class Claim(NamedTuple):
    """One context a ticker now holds: the token proves it. Which version its run extracts is
    known when the run starts (worker/renew.lua), not at the claim, which reads no context's hash.

    A named tuple, not a frozen dataclass: a claim makes up to ``claim_batch`` of them per call,
    and a frozen dataclass's ``__init__`` (one ``object.__setattr__`` per field) took 2.6 times
    as long as a tuple's (bench P2's profile, docs/benchmarks.md)."""

    context_id: str
    token: str


@dataclass(frozen=True, slots=True)
class ClaimBatch:
    claims: list[Claim] = field(default_factory=list)
    examined: int = 0
    full: bool = False  # `inflight` reached max_inflight: backpressure, stop claiming
    deferred: int = 0  # due, but their user was at max_inflight_per_user: moved back in `due`


@dataclass(frozen=True, slots=True)
class ReapResult:
    requeued: int = 0
    dead: int = 0


@dataclass(frozen=True, slots=True)
class DeadEntry:
    context_id: str
    dead_at_ms: int
    attempts: int
    last_error: str
    expires_at_ms: int = 0  # when the dead letter (and the text it holds) is deleted


class QueueClient:
    """The worker side of the Redis contract, on one client (its scripts registered once)."""

    def __init__(self, settings: MemqSettings, redis_client: RedisClient) -> None:
        self.settings = settings
        self.redis = redis_client
        self.keys = KeySchema(settings.key_prefix, settings.shards)
        self._scripts = LuaScripts(redis_client, "worker", _SCRIPTS)
        self._metrics = MetricsRecorder(redis_client, self.keys.metrics())

    # --- claim and reap (the ticker)
    def claim(self, now: int | None = None, limit: int | None = None) -> ClaimBatch:
        """Claim up to ``limit`` (default ``claim_batch``) due contexts of each shard.

        One round trip for every shard (claim_due.lua reads its candidates itself with an
        O(log N + limit) range read), so this stays cheap however many keys are pending, and
        racing tickers never claim one twice. A candidate whose user already holds
        ``max_inflight_per_user`` leases is not claimed but moved back one tick in ``due``, so
        the next batch reaches other users' keys.
        """
        settings = self.settings
        now = now_ms() if now is None else now
        limit = limit or settings.claim_batch
        cap = math.ceil(settings.max_inflight / settings.shards)
        # Not divided by the shard count: one (user, agent) always lives in one shard, so a
        # share of the cap per shard would leave each (user, agent) a fraction of it.
        user_cap = settings.max_inflight_per_user
        defer_ms = max(1, int(settings.tick_seconds * 1000))
        claims: list[Claim] = []
        examined = deferred = 0
        full = False
        calls = [
            (
                [
                    shard.due,
                    shard.inflight,
                    shard.epoch,
                    shard.batch_pending,
                    shard.batched,
                    shard.user_leases,
                    shard.claims,
                ],
                [
                    now,
                    settings.lease_ms,
                    cap,
                    user_cap,
                    defer_ms,
                    limit,
                    shard.context_prefix,
                ],
            )
            for shard in self.keys.all_shards()
        ]
        for raw in script_per_shard(self.redis, self._scripts["claim_due"], calls):
            if raw is None:  # its master did not answer: its shards wait for the next tick
                continue
            full = full or int(raw[0]) == 2
            deferred += int(raw[1])
            examined += int(raw[3])
            first = int(raw[2])  # the tokens are consecutive, in claim order (claim_due.lua)
            claims += (Claim(str(cid), str(first + k)) for k, cid in enumerate(raw[4:]))
        return ClaimBatch(claims=claims, examined=examined, full=full, deferred=deferred)

    def reap(self, now: int | None = None, limit: int = 1000) -> ReapResult:
        """Put contexts whose lease expired back in ``due`` (or ``dead`` past max_attempts, counting
        only runs that had started and whose version did not move)."""
        now = now_ms() if now is None else now
        requeued = dead = 0
        expired_before = now - self.settings.dead_retention_ms
        shards = self.keys.all_shards()
        # Dead letters past their retention: their hashes already expired (fail and reap set the
        # TTL when they die); the ids go too. Pipelined with the expired-lease reads below.
        found = due_members(
            self.redis,
            [s.inflight for s in shards],
            now,
            limit,
            also=lambda pipe, i: pipe.zremrangebyscore(shards[i].dead, "-inf", expired_before),
        )
        for shard, ids in zip(shards, found, strict=True):
            for start in range(0, len(ids), _SCRIPT_BATCH):  # bounded script size and run time
                batch = ids[start : start + _SCRIPT_BATCH]
                keys = [shard.inflight, shard.due, shard.dead, shard.user_leases, shard.claims]
                keys += (shard.context(context_id) for context_id in batch)
                raw = self._scripts["reap_expired"](
                    keys=keys,
                    args=[
                        now,
                        self.settings.max_attempts,
                        self.settings.dead_retention_ms,
                        *batch,
                    ],
                )
                requeued += int(raw[0])
                dead += int(raw[1])
        return ReapResult(requeued=requeued, dead=dead)

    def release(self, context_id: str, token: str, now: int | None = None) -> bool:
        """Hand a claim back without counting an attempt (its task could not be sent)."""
        q = self._q(context_id)
        now = now_ms() if now is None else now
        raw = self._scripts["release"](
            keys=[q.context(context_id), q.inflight, q.due, q.user_leases, q.claims],
            args=[context_id, token, now],
        )
        return int(raw) == 1

    def defer(
        self, context_id: str, token: str, run_at_ms: int, slot_ms: int | None = None
    ) -> bool:
        """Hand a claim back to run at ``run_at_ms``, without counting an attempt (the run may
        not call the model before then), with the rate-limit slot reserved for that run, if any;
        False when the claim is no longer ours."""
        q = self._q(context_id)
        raw = self._scripts["defer"](
            keys=[q.context(context_id), q.inflight, q.due, q.user_leases, q.claims],
            args=[context_id, token, max(0, int(run_at_ms)), "" if slot_ms is None else slot_ms],
        )
        return int(raw) == 1

    # --- the extract task
    def load(self, context_id: str) -> dict[str, str]:
        """The ``ctx:<id>`` hash ({} when it is gone)."""
        raw = self.redis.hgetall(self._q(context_id).context(context_id))
        return {str(k): str(v) for k, v in raw.items()}

    def renew(self, context_id: str, token: str, now: int | None = None) -> bool:
        """Extend the lease by ``lease_ms`` from now and mark the run as started (an expired lease
        then counts as an attempt); False when the claim is no longer ours."""
        now = now_ms() if now is None else now
        keys, args = self._renew_call(self._q(context_id), context_id, token, now)
        return int(self._scripts["renew"](keys=keys, args=args)) == 1

    def _renew_call(
        self, q: QueueKeys, context_id: str, token: str, now: int
    ) -> tuple[list[str], list[str | int]]:
        keys = [q.context(context_id), q.inflight, q.user_leases, q.claims]
        return keys, [context_id, token, now + self.settings.lease_ms]

    def load_run(self, context_id: str) -> tuple[dict[str, str], str | None]:
        """The ``ctx:<id>`` hash and the thread's watermark (None when unset), in one round trip."""
        data, watermark, _ = self.start_run(context_id, None)
        return data, watermark

    def start_run(
        self,
        context_id: str,
        token: str | None,
        now: int | None = None,
        *,
        also: AlsoRead | None = None,
    ) -> tuple[dict[str, str], str | None, bool]:
        """:meth:`load_run` and, with ``token``, the run's first :meth:`renew` in the same round
        trip; the third value says whether it renewed. The renew goes first: it starts the run
        (worker/renew.lua writes the run's fields, its claimed version among them), so the hash
        read after it holds at least what the run claims to extract. It checks the token itself,
        so for a claim that is gone it changes nothing. ``also``: one more read sent in that
        round trip (the memory the run extracts into), handed its reply."""
        q = self._q(context_id)
        now = now_ms() if now is None else now
        renewed = False
        renewing = token is not None and isinstance(self.redis, redis.Redis)
        if token is not None and not renewing:  # a cluster client: the wrapper's own call first
            renewed = self.renew(context_id, token, now)
        pipe = self.redis.pipeline(transaction=False)
        if renewing and token is not None:
            # EVALSHA itself: redis-py's Script in a pipeline asks SCRIPT EXISTS first.
            keys, args = self._renew_call(q, context_id, token, now)
            pipe.evalsha(self._scripts["renew"].sha, len(keys), *keys, *args)
        pipe.hgetall(q.context(context_id))
        pipe.get(q.watermark(context_id))
        reading = also is not None and also.queue(pipe)
        replies = pipe.execute(raise_on_error=False)
        if reading and also is not None:
            also.take(replies.pop())  # its error, if any, is the reader's to raise
        if renewing and token is not None:
            answer = replies.pop(0)
            if isinstance(answer, NoScriptError):
                # A restarted Redis forgot the script: nothing ran, so renew through the loader
                # and read the hash again, after the start.
                renewed = self.renew(context_id, token, now)
                replies = [self.redis.hgetall(q.context(context_id)), replies[1]]
            elif isinstance(answer, Exception):
                raise answer
            else:
                renewed = int(answer) == 1
        raw, watermark = replies
        for reply in (raw, watermark):
            if isinstance(reply, Exception):
                raise reply
        data = {str(k): str(v) for k, v in raw.items()}
        if data.get("cut_messages"):
            self._report_cut(q, context_id)
        return data, (str(watermark) if watermark is not None else None), renewed

    def _report_cut(self, q: QueueKeys, context_id: str) -> None:
        """enqueue.lua cut the oldest messages to stay within context_max_bytes: take its counts
        off the hash (atomically, so a cut made meanwhile is kept for the next run, and a retry
        of this run reports nothing again), add them to the metrics and say so in the run's log
        (the counts only, never the text)."""
        ctx = q.context(context_id)
        pipe = self.redis.pipeline(transaction=True)
        pipe.hmget(ctx, ["cut_messages", "cut_bytes"])
        pipe.hdel(ctx, "cut_messages", "cut_bytes")
        (messages, cut_bytes), _ = pipe.execute()
        if not messages:
            return
        self._metrics.count(context_messages_cut=int(messages))
        log.warning(
            "context %s: %s messages (%s bytes) were cut before extraction to stay within "
            "context_max_bytes",
            context_id,
            messages,
            cut_bytes if cut_bytes is not None else "?",
        )

    def complete(
        self,
        context_id: str,
        token: str,
        now: int | None = None,
        *,
        watermark: str | None = None,
        more: bool = False,
        also: AlsoQueue | None = None,
    ) -> CompleteResult:
        """Settle a successful run; ``watermark`` (None: leave it) is stored with the settlement,
        so only the run that still holds the claim can advance it. ``more``: the run extracted
        only part of the messages, so the context is rescheduled due now rather than deleted.
        ``also``: commands sent after the script in its round trip (:func:`call_then`)."""
        q = self._q(context_id)
        now = now_ms() if now is None else now
        raw = call_then(
            self.redis,
            self._scripts["complete"],
            [
                q.context(context_id),
                q.inflight,
                q.due,
                q.watermark(context_id),
                q.user_leases,
                q.claims,
            ],
            [
                context_id,
                token,
                now,
                watermark or "",
                self.settings.watermark_ttl_ms,
                "1" if more else "0",
            ],
            also,
        )
        return CompleteResult(int(raw))

    def watermark(self, context_id: str) -> str | None:
        """The stored watermark of a context (None when there is none)."""
        raw = self.redis.get(self._q(context_id).watermark(context_id))
        return str(raw) if raw is not None else None

    def fail(
        self,
        context_id: str,
        token: str,
        reason: str,
        retry_at_ms: int | None,
        now: int | None = None,
    ) -> FailResult:
        """Count a failed attempt; ``retry_at_ms=None`` is permanent (dead at once)."""
        q = self._q(context_id)
        now = now_ms() if now is None else now
        retry = _PERMANENT if retry_at_ms is None else str(max(int(retry_at_ms), 0))
        raw = self._scripts["fail"](
            keys=[
                q.context(context_id),
                q.inflight,
                q.due,
                q.dead,
                q.user_leases,
                q.claims,
            ],
            args=[
                context_id,
                token,
                now,
                reason[:2000],
                retry,
                self.settings.max_attempts,
                self.settings.dead_retention_ms,
            ],
        )
        return FailResult(int(raw))

    # --- dead letters (the CLI)
    def dead_list(self, limit: int = 1000) -> list[DeadEntry]:
        """Dead contexts, oldest death first, with their attempt count and last error."""
        rows: list[tuple[str, int]] = []
        for shard in self.keys.all_shards():
            found = cast(
                "list[tuple[Any, float]]",
                self.redis.zrange(shard.dead, 0, limit - 1, withscores=True),
            )
            rows.extend((str(member), int(score)) for member, score in found)
        rows.sort(key=lambda row: row[1])
        rows = rows[:limit]
        pipe = self.redis.pipeline(transaction=False)
        for context_id, _ in rows:
            pipe.hmget(self._q(context_id).context(context_id), ["attempts", "last_error"])
        details = pipe.execute() if rows else []
        return [
            DeadEntry(
                context_id=context_id,
                dead_at_ms=dead_at,
                attempts=int(attempts or 0),
                last_error=str(error) if error is not None else "",
                expires_at_ms=dead_at + self.settings.dead_retention_ms,
            )
            for (context_id, dead_at), (attempts, error) in zip(rows, details, strict=True)
        ]

    def dead_retry(self, ids: Iterable[str] | Literal["all"], now: int | None = None) -> int:
        """Move dead contexts back to ``due`` now with attempts reset; returns how many."""
        now = now_ms() if now is None else now
        total = 0
        for shard, batch in dead_batches(self.redis, self.keys, ids, _DEAD_BATCH):
            total += int(
                self._scripts["dead_retry"](
                    keys=[shard.dead, shard.due, *(shard.context(i) for i in batch)],
                    args=[now, self.settings.context_retention_ms, *batch],
                )
            )
        return total

    def dead_purge(self, ids: Iterable[str] | Literal["all"]) -> int:
        """Delete dead contexts for good; returns how many."""
        total = 0
        for shard, batch in dead_batches(self.redis, self.keys, ids, _DEAD_BATCH):
            total += int(
                self._scripts["dead_purge"](
                    keys=[shard.dead, *(shard.context(i) for i in batch)], args=list(batch)
                )
            )
        return total

    # --- observing
    def stats(self, now: int | None = None) -> dict[str, Any]:
        """What `memq stats --json` prints: queue depths, lag and the counters."""
        return summarise(read_snapshot(self.redis, self.settings, now_ms() if now is None else now))

    # --- helpers
    def _q(self, context_id: str) -> QueueKeys:
        return self.keys.for_context(context_id)
