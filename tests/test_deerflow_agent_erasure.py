"""Deleting one agent's memory and queued work, from the operator's side (``memq forget USER
--agent NAME``) and with hostile names at DeerFlow's hook. Real redis-server; the run in flight is
fenced like a forgotten user's."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Any

import pytest
import redis

from memq.cli import main
from memq.core.errors import StaleClaim
from memq.core.identity import encode_user
from memq.core.keys import KeySchema
from memq.core.settings import MemqSettings
from memq.testing.redis_dump import dump_redis
from storage import Fence, get_storage
from storage.document import Fact, MemoryDocument
from storage.erasure import erase
from tests.support.world import T0, World
from worker.queue import CompleteResult

STANDIN = Path(__file__).parent / "support" / "deerflow_standin"
if str(STANDIN) not in sys.path:
    sys.path.insert(0, str(STANDIN))

pytestmark = pytest.mark.integration

# An e-mail address, as applications (and DeerFlow's own tests) key their users.
KIM = "kim@example.com"


@pytest.fixture(params=["redis", "file"])
def world(request: Any, make_settings: Any, redis_client: redis.Redis) -> World:
    settings = make_settings(storage=request.param, debounce_seconds=60.0, max_delay_seconds=600.0)
    return World(settings, redis_client)


def _env(monkeypatch: pytest.MonkeyPatch, settings: MemqSettings) -> None:
    for name in ("redis_url", "key_prefix", "storage", "storage_dir", "data_dir", "llm_provider"):
        monkeypatch.setenv(f"MEMQ_{name.upper()}", str(getattr(settings, name)))


def test_forget_one_agent_from_the_cli_fences_its_run_and_keeps_the_rest(
    world: World,
    redis_client: redis.Redis,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    queue = world.queue
    world.remember(KIM, "kim-global-keep")
    world.remember(KIM, "kim-helper-secret", agent="helper")
    running = world.enqueue("t-run", KIM, "kim-run-secret", agent="helper", flush=True)
    [in_flight] = queue.claim(T0 + 1).claims
    dead = world.enqueue("t-dead", KIM, "kim-dead-secret", agent="helper", flush=True, now=T0 + 2)
    [claim] = queue.claim(T0 + 3).claims
    queue.fail(dead, claim.token, "PermanentLLMError: bad request", None, T0 + 4)
    world.enqueue("t-wait", KIM, "kim-wait-secret", agent="helper", now=T0 + 5)
    world.enqueue("t-other", KIM, "kim-coder-keep", agent="coder", now=T0 + 6)
    _env(monkeypatch, world.settings)

    assert main(["forget", KIM, "--agent", "helper"]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"forgot agent helper of user {KIM}: 1 memory document")
    assert "1 pending context" in out and "1 context in flight" in out and "1 dead letter" in out

    # The run in flight can no longer write the agent's memory back.
    with pytest.raises(StaleClaim):
        world.storage.update(
            KIM,
            "helper",
            lambda d: MemoryDocument(facts=[Fact(content="kim-late")]),
            fence=Fence(running, in_flight.token),
        )
    assert queue.complete(running, in_flight.token, T0 + 7) is CompleteResult.STALE
    values = "\n".join(dump_redis(redis_client).values())
    assert "kim-run-secret" not in values and "kim-dead-secret" not in values
    assert "kim-wait-secret" not in values and "kim-coder-keep" in values
    assert world.storage.load(KIM, "helper").facts == []
    assert [f.content for f in world.storage.load(KIM).facts] == ["kim-global-keep"]
    assert main(["forget", KIM, "--agent", "helper"]) == 0
    assert f"nothing held about agent helper of user {KIM}" in capsys.readouterr().out


def _manager(settings: MemqSettings) -> Any:
    from memq.integrations.deerflow import MemqMemoryManager

    return MemqMemoryManager.from_config(
        {
            "redis_url": settings.redis_url,
            "key_prefix": settings.key_prefix,
            "storage": "file",
            "storage_dir": str(settings.storage_dir),
        }
    )


@pytest.mark.parametrize("agent", ["coder\x1b[2K", "", " ", "a" * 10_000, "co\u202eder", "co\nder"])
def test_hostile_agent_names_are_refused_and_erase_nothing(
    make_settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    agent: str,
) -> None:
    settings = make_settings(storage="file")
    store = get_storage(settings)
    store.save(KIM, "coder", MemoryDocument(facts=[Fact(content="kim-coder-keep")]))
    manager = _manager(settings)
    with pytest.raises(ValueError) as raised:
        manager.discard_pending_updates(user_id=KIM, agent_name=agent)
    assert "\n" not in str(raised.value)
    _env(monkeypatch, settings)
    assert main(["forget", KIM, "--agent", agent]) != 0
    [line] = capsys.readouterr().err.strip().splitlines()
    assert "agent" in line
    assert [f.content for f in store.load(KIM, "coder").facts] == ["kim-coder-keep"]
    manager.close()


@pytest.mark.parametrize("agent", ["../coder", "co:der", "coder/..", "{coder}"])
def test_names_that_look_like_paths_or_keys_erase_only_their_own_agent(
    make_settings: Any,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
    agent: str,
) -> None:
    """Printable names are valid agent names (encoded for keys and files): erasing one never
    reaches the agent its text resembles, nor a folder outside the user's."""
    settings = make_settings(storage="file")
    store = get_storage(settings)
    store.save(KIM, "coder", MemoryDocument(facts=[Fact(content="kim-coder-keep")]))
    store.save(KIM, agent, MemoryDocument(facts=[Fact(content="kim-odd-secret")]))
    manager = _manager(settings)
    assert manager.discard_pending_updates(user_id=KIM, agent_name=agent) == 0
    assert store.load(KIM, agent).facts == []
    assert [f.content for f in store.load(KIM, "coder").facts] == ["kim-coder-keep"]
    _env(monkeypatch, settings)
    assert main(["forget", KIM, "--agent", agent]) == 0
    assert "nothing held about agent" in capsys.readouterr().out
    assert [f.content for f in store.load(KIM, "coder").facts] == ["kim-coder-keep"]
    manager.close()


@pytest.mark.parametrize("path", ["bad\x00path", "x" * 5000])
def test_an_unusable_storage_path_fails_at_construction(make_settings: Any, path: str) -> None:
    from deerflow.agents.memory.manager import build_memory_manager

    settings = make_settings(storage="file")
    config = {"redis_url": settings.redis_url, "key_prefix": settings.key_prefix, "storage": "file"}
    with pytest.raises(ValueError, match="not a usable folder") as raised:
        build_memory_manager(
            "memq.integrations.deerflow:MemqMemoryManager", config, storage_path=path
        )
    assert "\n" not in str(raised.value) and len(str(raised.value)) < 400


def test_forgetting_the_agent_holding_a_capped_users_last_lease_leaves_no_per_user_record(
    make_settings: Any, redis_client: redis.Redis, capsys: pytest.CaptureFixture[str]
) -> None:
    """A user at the in-flight cap gets a deferral horizon (`~<user>`) beside its lease count;
    when the erased agent held the user's last lease, both must go with the lease, as they do
    when a run ends, rather than stay behind naming the user with no lease out."""
    settings = make_settings(
        storage="redis", debounce_seconds=60.0, max_delay_seconds=600.0, max_inflight_per_user=1
    )
    world = World(settings, redis_client)
    queue = world.queue
    leases = KeySchema(settings.key_prefix, settings.shards).shard(0).user_leases
    world.enqueue("t-run", KIM, "kim-run", agent="helper", flush=True)
    world.enqueue("t-wait", KIM, "kim-wait", agent="coder", flush=True)
    [claimed] = queue.claim(T0 + 1).claims  # one lease: the other is deferred behind it
    assert claimed.context_id.endswith(":helper")
    assert redis_client.hexists(leases, f"~{encode_user(KIM)}")

    erase(settings, redis_client, world.storage, KIM, agent_name="helper")

    assert not redis_client.exists(leases)  # neither the count nor the horizon is left
    assert queue.stats()["due"] == 1  # the coder's conversation waits, and is claimed next
    [next_claim] = queue.claim(T0 + 10_000).claims
    assert next_claim.context_id.endswith(":coder")
