"""Reading (and claiming) every shard's candidates at once: one pipeline, or one per master on a
cluster, where a master that does not answer costs its own shards the tick, not every shard's."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Literal

from redis.cluster import RedisCluster
from redis.exceptions import ClusterDownError, NoScriptError, SlotNotCoveredError, TryAgainError

from memq.core.connection import UNREACHABLE_ERRORS, RedisClient
from memq.core.keys import KeySchema, QueueKeys

if TYPE_CHECKING:
    from redis.commands.core import Script

log = logging.getLogger("memq.tick")

# A master that is gone or whose slots are moving to its promoted replica.
_MASTER_AWAY: tuple[type[Exception], ...] = (
    *UNREACHABLE_ERRORS,
    ClusterDownError,
    SlotNotCoveredError,
    TryAgainError,
)


def _by_master(client: RedisClient, keys: Sequence[str]) -> dict[str, list[int]]:
    """The indexes of ``keys`` grouped by the master that holds each (one group, named "", on a
    single Redis)."""
    if not isinstance(client, RedisCluster):
        return {"": list(range(len(keys)))}
    groups: dict[str, list[int]] = {}
    for index, key in enumerate(keys):
        node = client.get_node_from_key(key)  # type: ignore[no-untyped-call]
        groups.setdefault(node.name, []).append(index)
    return groups


def _master_away(node_name: str, exc: Exception, shards: int) -> None:
    """Log a master that did not answer; on a single Redis (no name) the error is the caller's."""
    if not node_name:
        raise exc
    log.warning(
        "master %s did not answer (%s); its %d shard(s) wait for the next tick",
        node_name,
        type(exc).__name__,
        shards,
    )


def script_per_shard(
    client: RedisClient, script: Script, calls: Sequence[tuple[Sequence[str], Sequence[Any]]]
) -> list[Any]:
    """``script``'s reply to each ``(keys, args)`` call (one per shard), every call sent at once:
    a lone call on a single Redis directly, several in one pipeline without MULTI (the shards sit
    in different slots), one pipeline per master on a cluster. A shard whose master did not
    answer gets None. A Redis that forgot the script (restarted) runs that call through the
    wrapper, which loads it: an EVALSHA answered NOSCRIPT did nothing, so nothing runs twice."""
    replies: list[Any] = [None] * len(calls)
    if len(calls) == 1 and not isinstance(client, RedisCluster):
        keys, args = calls[0]
        return [script(keys=keys, args=args)]
    for node_name, indexes in _by_master(client, [keys[0] for keys, _ in calls]).items():
        pipe = client.pipeline(transaction=False)
        for index in indexes:
            keys, args = calls[index]
            pipe.evalsha(script.sha, len(keys), *keys, *args)
        try:
            answers = pipe.execute(raise_on_error=False)
        except _MASTER_AWAY as exc:
            _master_away(node_name, exc, len(indexes))
            continue
        for index, answer in zip(indexes, answers, strict=True):
            if isinstance(answer, NoScriptError):
                keys, args = calls[index]
                answer = script(keys=keys, args=args)
            elif isinstance(answer, Exception):
                raise answer
            replies[index] = answer
    return replies


def due_members(
    client: RedisClient,
    zsets: Sequence[str],
    now: int,
    limit: int,
    *,
    also: Callable[[Any, int], object] | None = None,
) -> list[list[str]]:
    """The members scored up to ``now`` (at most ``limit``) of each zset, pipelined without
    MULTI (the zsets sit in different slots). ``also(pipe, i)`` queues one more command
    after the read of zset i (same slot); its reply is dropped.

    On a cluster, one pipeline per master: a master that does not answer (it died and its
    replica is not promoted yet) costs its own shards this tick, not every shard's."""
    found: list[list[str]] = [[] for _ in zsets]
    step = 1 if also is None else 2
    for node_name, indexes in _by_master(client, zsets).items():
        pipe = client.pipeline(transaction=False)
        for index in indexes:
            pipe.zrangebyscore(zsets[index], "-inf", now, start=0, num=limit)
            if also is not None:
                also(pipe, index)
        try:
            replies = pipe.execute()
        except _MASTER_AWAY as exc:
            _master_away(node_name, exc, len(indexes))
            continue
        for position, index in enumerate(indexes):
            found[index] = [str(member) for member in replies[position * step]]
    return found


def dead_batches(
    client: RedisClient, keys: KeySchema, ids: Iterable[str] | Literal["all"], size: int
) -> Iterable[tuple[QueueKeys, Sequence[str]]]:
    """Dead letters to act on, grouped by shard in batches of ``size`` ids (one script call
    each): every dead letter of every shard, or the given ids."""
    if ids == "all":
        for shard in keys.all_shards():
            members = [str(m) for m in client.zrange(shard.dead, 0, -1)]
            for start in range(0, len(members), size):
                yield shard, members[start : start + size]
        return
    by_shard: dict[int, list[str]] = {}
    for context_id in ids:
        by_shard.setdefault(keys.shard_of(context_id), []).append(context_id)
    for index, members in by_shard.items():
        for start in range(0, len(members), size):
            yield keys.shard(index), members[start : start + size]
