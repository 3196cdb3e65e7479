"""Redis URL forms memq understands beyond redis-py's own: Redis Cluster and Sentinel.

* ``redis+cluster://[user:password@]host:port[,host:port…][/0]`` (``rediss+cluster://``: TLS);
* ``redis+sentinel://[user:password@]host:port[,host:port…]/master_name[/db]``
  (``rediss+sentinel://``: TLS to the master; the credentials are the master's).

Pure parsing, so settings validation, the connection factory and the broker wiring share it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Literal
from urllib.parse import unquote, urlsplit, urlunsplit

from memq.core.errors import ConfigError

Kind = Literal["single", "cluster", "sentinel"]

_CLUSTER_SCHEMES = {"redis+cluster": False, "rediss+cluster": True}
_SENTINEL_SCHEMES = {"redis+sentinel": False, "rediss+sentinel": True}


@dataclass(frozen=True, slots=True)
class RedisTarget:
    """A parsed cluster or Sentinel URL (a plain URL is left to redis-py)."""

    kind: Kind
    url: str
    hosts: tuple[tuple[str, int], ...] = ()
    tls: bool = False
    username: str | None = None
    password: str | None = None
    master_name: str | None = None
    db: int = 0


def url_kind(url: str) -> Kind:
    scheme = url.partition("://")[0].lower()
    if scheme in _CLUSTER_SCHEMES:
        return "cluster"
    if scheme in _SENTINEL_SCHEMES:
        return "sentinel"
    return "single"


def parse_redis_url(url: str) -> RedisTarget:
    """Split a cluster or Sentinel URL into hosts, credentials, master name and db.

    Raises :class:`ConfigError` naming what is wrong (never echoing the password)."""
    kind = url_kind(url)
    if kind == "single":
        return RedisTarget(kind, url)
    scheme, _, rest = url.partition("://")
    scheme = scheme.lower()
    rest = rest.partition("?")[0].partition("#")[0]
    netloc, _, path = rest.partition("/")
    username = password = None
    if "@" in netloc:
        userinfo, _, netloc = netloc.rpartition("@")
        user_part, colon, password_part = userinfo.partition(":")
        username = unquote(user_part) or None
        password = unquote(password_part) if colon else None
    hosts = tuple(_host_port(part, scheme) for part in netloc.split(",") if part.strip())
    if not hosts:
        raise ConfigError(f"{scheme}:// URL names no host:port")
    segments = [s for s in path.split("/") if s]
    if kind == "cluster":
        if len(segments) > 1 or (segments and segments[0] != "0"):
            raise ConfigError(f"{scheme}:// URL: Redis Cluster has only database 0")
        return RedisTarget(kind, url, hosts, _CLUSTER_SCHEMES[scheme], username, password, None, 0)
    if not segments or len(segments) > 2:
        raise ConfigError(
            f"{scheme}:// URL must end in /master_name or /master_name/db "
            "(the name the Sentinels monitor)"
        )
    db = 0
    if len(segments) == 2:
        if not segments[1].isdigit():
            raise ConfigError(f"{scheme}:// URL: the database must be a number")
        db = int(segments[1])
    return RedisTarget(
        kind, url, hosts, _SENTINEL_SCHEMES[scheme], username, password, unquote(segments[0]), db
    )


def _host_port(part: str, scheme: str) -> tuple[str, int]:
    host, colon, port = part.strip().rpartition(":")
    if not colon or not host or not port.isdigit():
        raise ConfigError(f"{scheme}:// URL: {part.strip()!r} is not host:port")
    return host.strip("[]"), int(port)


CLUSTER_BROKER_ERROR = (
    "the broker cannot be a Redis Cluster (kombu has no cluster transport): set MEMQ_BROKER_URL "
    "to a plain or sentinel:// Redis"
)


@dataclass(frozen=True, slots=True)
class BrokerTarget:
    """What Celery gets: a kombu URL and its transport options (Sentinel's ``master_name``)."""

    url: str
    transport_options: dict[str, str]


def broker_target(broker_url: str | None, redis_url: str, master_name: str | None) -> BrokerTarget:
    """The Celery broker for these settings; raises :class:`ConfigError` when none can work.

    Without a broker URL the broker is the data Redis: as is for one Redis, kombu's Sentinel
    form of the same Sentinels for ``redis+sentinel://``, and an error for a cluster."""
    url = broker_url or redis_url
    kind = url_kind(url)
    if kind == "cluster":
        raise ConfigError(CLUSTER_BROKER_ERROR)
    if kind == "sentinel":
        target = parse_redis_url(url)
        assert target.master_name is not None  # parse_redis_url requires it
        return BrokerTarget(_kombu_sentinel_url(target), {"master_name": target.master_name})
    if url.partition("://")[0].lower() == "sentinel":
        if not master_name:
            raise ConfigError(
                "MEMQ_BROKER_URL is a sentinel:// URL: set MEMQ_BROKER_MASTER_NAME to the name "
                "the Sentinels monitor"
            )
        return BrokerTarget(url, {"master_name": master_name})
    return BrokerTarget(url, {})


def _kombu_sentinel_url(target: RedisTarget) -> str:
    """kombu spells several Sentinels as ``sentinel://h1:p1;sentinel://h2:p2/db``; the password
    in the URL is the master's."""
    auth = ""
    if target.password is not None or target.username:
        auth = f"{target.username or ''}:{target.password or ''}@"
    nodes = ";".join(f"sentinel://{auth}{host}:{port}" for host, port in target.hosts)
    return f"{nodes}/{target.db}"


_USERINFO = re.compile(r"(://[^:@/;,]*):[^@/;,]*@")
_SECRET_QUERY = re.compile(r"(?i)((?:^|&)(?:password|pass|pwd|token|api_key|key|secret)=)[^&]*")


def mask_url(url: str) -> str:
    """The URL with its password (in the user part or a ``password=``-like query parameter)
    replaced by ``***``; user names stay, they help debugging."""
    if any(sep in url.partition("://")[2].partition("/")[0] for sep in ",;"):
        # Several hosts (a cluster, Sentinels, kombu's `sentinel://a;sentinel://b`): urlsplit
        # cannot read their ports; mask each `user:password@` in place.
        masked = _USERINFO.sub(r"\1:***@", url)
        head, question, query = masked.partition("?")
        return head + question + _SECRET_QUERY.sub(r"\1***", query)
    try:
        parts = urlsplit(url)
        password, port = parts.password, parts.port
    except ValueError:
        return "<unparsable url>"
    if password is not None:
        user = parts.username or ""
        host = parts.hostname or ""
        if ":" in host:  # IPv6 literal
            host = f"[{host}]"
        parts = parts._replace(netloc=f"{user}:***@{host}" + (f":{port}" if port else ""))
    if parts.query:
        parts = parts._replace(query=_SECRET_QUERY.sub(r"\1***", parts.query))
    return urlunsplit(parts)
