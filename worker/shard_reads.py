"""Reading every shard's candidates at once: one pipeline, or one per master on a cluster."""

from __future__ import annotations

import logging
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Literal

from redis.cluster import RedisCluster
from redis.exceptions import ClusterDownError, SlotNotCoveredError, TryAgainError

from memq.core.connection import UNREACHABLE_ERRORS, RedisClient
from memq.core.keys import KeySchema, QueueKeys

log = logging.getLogger("memq.tick")

# A master that is gone or whose slots are moving to its promoted replica.
_MASTER_AWAY: tuple[type[Exception], ...] = (
    *UNREACHABLE_ERRORS,
    ClusterDownError,
    SlotNotCoveredError,
    TryAgainError,
)


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
    groups: dict[str, list[int]] = {"": list(range(len(zsets)))}
    if isinstance(client, RedisCluster):
        groups = {}
        for index, zset in enumerate(zsets):
            node = client.get_node_from_key(zset)  # type: ignore[no-untyped-call]
            groups.setdefault(node.name, []).append(index)
    found: list[list[str]] = [[] for _ in zsets]
    step = 1 if also is None else 2
    for node_name, indexes in groups.items():
        pipe = client.pipeline(transaction=False)
        for index in indexes:
            pipe.zrangebyscore(zsets[index], "-inf", now, start=0, num=limit)
            if also is not None:
                also(pipe, index)
        try:
            replies = pipe.execute()
        except _MASTER_AWAY as exc:
            if not node_name:
                raise
            log.warning(
                "master %s did not answer (%s); its %d shard(s) wait for the next tick",
                node_name,
                type(exc).__name__,
                len(indexes),
            )
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
