"""A dump of a whole Redis keyspace as text, for tests and the soak's oracle that check what is
left in Redis (erasure, retention)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memq.core.connection import RedisClient


def text_of(value: Any) -> str:
    """A Redis reply as text (bytes decoded, anything else ``str``)."""
    return value.decode("utf-8", "replace") if isinstance(value, bytes) else str(value)


def dump_redis(client: RedisClient) -> dict[str, str]:
    """Every key and its whole value rendered as text: what an operator's SCAN would find (a
    forgotten user's text must be in none)."""
    out: dict[str, str] = {}
    for raw_key in client.scan_iter(count=1000):
        key = text_of(raw_key)
        kind = text_of(client.type(raw_key))
        value: Any
        if kind == "string":
            value = client.get(raw_key)
        elif kind == "hash":
            value = client.hgetall(raw_key)
        elif kind == "list":
            value = client.lrange(raw_key, 0, -1)
        elif kind == "set":
            value = client.smembers(raw_key)
        elif kind == "zset":
            value = client.zrange(raw_key, 0, -1, withscores=True)
        elif kind == "stream":
            value = client.xrange(raw_key)
        else:
            value = ""
        out[key] = _render(value)
    return out


def _render(value: Any) -> str:
    if isinstance(value, Mapping):
        return "\n".join(f"{_render(k)}={_render(v)}" for k, v in value.items())
    if isinstance(value, list | set | tuple):
        return "\n".join(_render(v) for v in value)
    return "" if value is None else text_of(value)
