"""The Redis URL forms (one node, cluster, Sentinel) and the broker each deployment gets."""

from __future__ import annotations

import pytest

from memq.core.errors import ConfigError
from memq.core.keys import CLUSTER_SLOTS, KeySchema, key_slot, shard_tag
from memq.core.redis_urls import broker_target, parse_redis_url, url_kind
from memq.core.settings import MemqSettings, load_settings
from worker.celery_app import celery_config


def test_cluster_urls_name_every_startup_node() -> None:
    target = parse_redis_url("rediss+cluster://app:s%40cret@10.0.0.1:7000,10.0.0.2:7001/0")
    assert target.kind == "cluster" and target.tls
    assert target.hosts == (("10.0.0.1", 7000), ("10.0.0.2", 7001))
    assert (target.username, target.password) == ("app", "s@cret")
    assert parse_redis_url("redis+cluster://h:1").hosts == (("h", 1),)


def test_sentinel_urls_name_the_master_and_db() -> None:
    target = parse_redis_url("redis+sentinel://:pw@s1:26379,s2:26380/mymaster/2")
    assert (target.kind, target.master_name, target.db, target.password) == (
        "sentinel",
        "mymaster",
        2,
        "pw",
    )
    assert target.hosts == (("s1", 26379), ("s2", 26380))
    assert url_kind("redis://localhost:6379/0") == "single"


@pytest.mark.parametrize(
    ("url", "problem"),
    [
        ("redis+cluster://h:1/3", "only database 0"),
        ("redis+cluster://", "names no host:port"),
        ("redis+cluster://h", "is not host:port"),
        ("redis+sentinel://s1:26379", "must end in /master_name"),
        ("redis+sentinel://s1:26379/m/x", "database must be a number"),
    ],
)
def test_bad_urls_are_one_clear_line_without_the_password(url: str, problem: str) -> None:
    with pytest.raises(ConfigError, match=problem) as caught:
        load_settings(redis_url=url.replace("//", "//:hunter2@", 1))
    assert "hunter2" not in str(caught.value)


def test_the_broker_follows_the_data_redis_except_on_a_cluster() -> None:
    assert broker_target(None, "redis://h:6379/0", None).url == "redis://h:6379/0"
    sentinel = broker_target(None, "redis+sentinel://:pw@s1:1,s2:2/mymaster/3", None)
    assert sentinel.url == "sentinel://:pw@s1:1;sentinel://:pw@s2:2/3"
    assert sentinel.transport_options == {"master_name": "mymaster"}
    with pytest.raises(ConfigError, match="the broker cannot be a Redis Cluster"):
        broker_target(None, "redis+cluster://h:1", None)
    with pytest.raises(ConfigError, match="the broker cannot be a Redis Cluster"):
        broker_target("redis+cluster://h:1", "redis://h:6379/0", None)
    with pytest.raises(ConfigError, match="MEMQ_BROKER_MASTER_NAME"):
        broker_target("sentinel://s1:1", "redis+cluster://h:1", None)
    assert broker_target("sentinel://s1:1", "x://", "m").transport_options == {"master_name": "m"}


def test_celery_gets_the_sentinel_master_name_and_refuses_a_cluster_broker() -> None:
    conf = celery_config(
        MemqSettings(
            redis_url="redis+cluster://h:1",
            shards=192,
            broker_url="sentinel://s1:26379;sentinel://s2:26379",
            broker_master_name="brokers",
        )
    )
    assert conf["broker_url"] == "sentinel://s1:26379;sentinel://s2:26379"
    assert conf["broker_transport_options"]["master_name"] == "brokers"
    # A producer needs no broker: its settings load; only Celery's side refuses.
    settings = load_settings(redis_url="redis+cluster://h:1", shards=192)
    with pytest.raises(ConfigError, match="set MEMQ_BROKER_URL to a plain or sentinel://"):
        celery_config(settings)


@pytest.mark.parametrize("shards", [2, 6, 64, 100, 256])
def test_shard_tags_sit_on_evenly_spaced_slots(shards: int) -> None:
    keys = KeySchema("memq", shards)
    for index in range(shards):
        slot = key_slot(shard_tag("memq", shards, index))
        assert index * CLUSTER_SLOTS // shards <= slot < (index + 1) * CLUSTER_SLOTS // shards
        assert keys.shard(index).due.startswith(f"memq:{{{shard_tag('memq', shards, index)}}}")
    # Three masters with equal slot ranges get equal shares (±1 when shards % 3 != 0).
    shares = [0, 0, 0]
    for index in range(shards):
        shares[key_slot(shard_tag("memq", shards, index)) * 3 // CLUSTER_SLOTS] += 1
    assert max(shares) - min(shares) <= 1
    assert KeySchema("memq", 1).shard(0).tag == "memq:{memq:0}"


def test_multi_host_urls_are_masked_for_display() -> None:
    from memq.core.redis_urls import mask_url

    assert mask_url("redis+cluster://:pw@h1:1,h2:2/0") == "redis+cluster://:***@h1:1,h2:2/0"
    assert mask_url("redis+sentinel://u:p@s1:1,s2:2/m/0") == "redis+sentinel://u:***@s1:1,s2:2/m/0"
    assert mask_url("sentinel://:pw@h:1;sentinel://:pw@h:2/0") == (
        "sentinel://:***@h:1;sentinel://:***@h:2/0"
    )
    assert mask_url("redis+cluster://h1:1,h2:2") == "redis+cluster://h1:1,h2:2"


def test_memq_up_refuses_a_cluster_without_a_broker(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    from memq.cli import main

    monkeypatch.setenv("MEMQ_REDIS_URL", "redis+cluster://127.0.0.1:1")
    monkeypatch.setenv("MEMQ_SHARDS", "192")
    assert main(["up"]) != 0
    err = capsys.readouterr().err
    assert "the broker cannot be a Redis Cluster" in err and "Traceback" not in err
