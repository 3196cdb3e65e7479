"""Conformance of ``memq.integrations.deerflow:MemqMemoryManager`` with DeerFlow's memory contract,
against the stand-in of DeerFlow's base class and call sites in tests/support/deerflow_standin
(DeerFlow f1f4af99b). Real Redis; the end-to-end case runs a real Celery worker and beat with the
real openai client against the scripted server."""

from __future__ import annotations

import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest
from langchain_core.messages import AIMessage, HumanMessage, SystemMessage, ToolMessage

from memq.core.settings import MemqSettings
from memq.local.redis_server import RedisServer
from prompts.injection import FRAME_LINE
from storage import get_storage
from storage.document import Fact, MemoryDocument
from storage.sections import Section
from tests.support.celery_procs import CeleryProcs, memq_env
from tests.support.openai_server import Reply, ScriptedOpenAI
from tests.support.scenarios import queue_idle, stack_settings, update_answer
from tests.support.waiting import wait_for
from worker.queue import QueueClient

STANDIN = Path(__file__).parent / "support" / "deerflow_standin"
if str(STANDIN) not in sys.path:
    sys.path.insert(0, str(STANDIN))

from deerflow import callsites  # noqa: E402
from deerflow.agents.memory.manager import (  # noqa: E402
    MemoryManager,
    MemoryManagerError,
    build_memory_manager,
)

from memq.integrations.deerflow import MemqMemoryManager  # noqa: E402

pytestmark = pytest.mark.integration

MANAGER_CLASS = "memq.integrations.deerflow:MemqMemoryManager"
# Users keyed by e-mail, as applications (and DeerFlow's own tests) key them.
ALICE = "alice@example.com"
DOC_KEYS = {"version", "lastUpdated", "user", "history", "facts"}
FACT_KEYS = {"id", "content", "category", "confidence", "createdAt", "source"}


def backend_config(settings: MemqSettings, **extra: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "redis_url": settings.redis_url,
        "key_prefix": settings.key_prefix,
        "storage": settings.storage,
        "storage_dir": str(settings.storage_dir),
        "llm_provider": settings.llm_provider,
        "debounce_seconds": settings.debounce_seconds,
        "max_delay_seconds": settings.max_delay_seconds,
        "token_counting": "char",  # DeerFlow's spelling
    }
    values.update(extra)
    return values


def build(settings: MemqSettings, *, mode: str = "middleware", **hooks: Any) -> MemqMemoryManager:
    manager = build_memory_manager(
        MANAGER_CLASS,
        backend_config(settings),
        mode=mode,  # type: ignore[arg-type]
        storage_path=str(settings.storage_dir),
        host_hooks=hooks,
    )
    assert isinstance(manager, MemqMemoryManager)
    return manager


@pytest.fixture(params=["file", "redis"])
def storage_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def made(make_settings: Any, storage_kind: str) -> Any:
    managers: list[MemqMemoryManager] = []

    def make(mode: str = "middleware", **overrides: Any) -> tuple[MemqMemoryManager, Any]:
        settings = make_settings(storage=storage_kind, **overrides)
        managers.append(build(settings, mode=mode))
        return managers[-1], settings

    yield make
    for manager in managers:
        manager.close()


def seed(settings: MemqSettings) -> None:
    store = get_storage(settings)
    store.save(
        ALICE,
        None,
        MemoryDocument(user={"work_context": Section(summary="Backend engineer at Acme")}),
    )
    store.save(
        ALICE,
        "coder",
        MemoryDocument(
            facts=[
                Fact(id="f_uv", content="Prefers uv over pip", confidence=0.9,
                     category="preference", source_thread_id="t-1"),
                Fact(id="f_zh", content="用户在杭州工作", confidence=0.8, category="context"),
            ]
        ),
    )  # fmt: skip


def test_not_importable_outside_deerflow() -> None:
    code = "import memq.integrations.deerflow"
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, cwd=Path(__file__).parents[1]
    )
    assert result.returncode != 0
    assert "No module named 'deerflow'" in result.stderr


def test_from_config_reads_memq_and_deerflow_setting_names(made: Any) -> None:
    manager, settings = made()
    assert isinstance(manager, MemoryManager)
    assert manager.settings.key_prefix == settings.key_prefix
    assert manager.settings.token_counting is False  # "char"
    assert manager.settings.storage_dir == settings.storage_dir  # memq's own name wins
    config = backend_config(
        settings, max_injection_tokens=321, debounce_seconds=None, max_delay_seconds=None
    )
    del config["storage_dir"]
    manager2 = build_memory_manager(MANAGER_CLASS, config, storage_path="/srv/deer-flow")
    assert isinstance(manager2, MemqMemoryManager)
    assert manager2.settings.injected_memory_max_tokens == 321
    assert manager2.settings.debounce_seconds == 30.0  # null = default (DeerFlow #4217)
    # DeerFlow's home holds its own users/*/memory.json: memq's files go beside them.
    assert manager2.settings.storage_dir == Path("/srv/deer-flow/memq")
    manager2.close()


def test_invariants_search_and_tool_mode(made: Any) -> None:
    assert MemqMemoryManager.supports_search is True
    manager, settings = made(mode="tool")
    assert manager.mode == "tool"
    seed(settings)
    context = manager.get_context(ALICE, agent_name="coder")
    assert "Backend engineer at Acme" in context  # user-level summaries
    assert "uv" not in context  # facts stay behind search in tool mode
    found = manager.search("uv", user_id=ALICE, agent_name="coder")
    assert [f["id"] for f in found] == ["f_uv"]
    tool = callsites.memory_search_tool(manager, "杭州", user_id=ALICE, agent_name="coder")
    assert '"count": 1' in tool and "杭州" in tool


def test_middleware_context_has_agent_facts_and_user_summaries(made: Any) -> None:
    manager, settings = made()
    seed(settings)
    text = manager.get_context(ALICE, agent_name="coder")
    assert "Backend engineer at Acme" in text and "Prefers uv over pip" in text
    assert "<user_memory>" not in text and "<memory>" not in text  # DeerFlow wraps it
    assert callsites.memory_context(manager, ALICE, "coder").startswith("<memory>\n")
    assert text.startswith(FRAME_LINE + "\n")  # framed as data, never instructions
    assert callsites.memory_context(manager, ALICE, "coder").count(FRAME_LINE) == 1
    assert manager.get_context("nobody", agent_name="coder") == ""


def test_every_method_returns_deerflows_shapes(made: Any) -> None:
    manager, settings = made()
    seed(settings)
    document = manager.get_memory(user_id=ALICE, agent_name="coder")
    assert set(document) == DOC_KEYS
    assert set(document["user"]) == {"workContext", "personalContext", "topOfMind"}
    assert set(document["history"]) == {"recentMonths", "earlierContext", "longTermBackground"}
    assert set(document["user"]["workContext"]) == {"summary", "updatedAt"}
    fact = next(f for f in document["facts"] if f["id"] == "f_uv")
    assert set(fact) == FACT_KEYS and fact["source"] == "t-1"
    assert fact["createdAt"].endswith("Z")
    assert manager.reload_memory(user_id=ALICE, agent_name="coder") == document
    assert manager.export_memory(user_id=ALICE, agent_name="coder") == document
    for found in manager.search("uv", 5, user_id=ALICE, agent_name="coder"):
        assert set(found) == FACT_KEYS
    assert manager.search("", user_id=ALICE) == []
    assert manager.search("uv", 0, user_id=ALICE) == []

    created, fact_id = manager.create_fact(
        "Likes green tea", "preference", 0.8, agent_name="coder", user_id=ALICE
    )
    assert set(created) == DOC_KEYS and fact_id in {f["id"] for f in created["facts"]}
    updated = manager.update_fact(fact_id, confidence=0.6, agent_name="coder", user_id=ALICE)
    assert next(f for f in updated["facts"] if f["id"] == fact_id)["confidence"] == 0.6
    after = manager.delete_fact(fact_id, agent_name="coder", user_id=ALICE)
    assert fact_id not in {f["id"] for f in after["facts"]}

    imported = manager.import_memory(
        {"facts": [{"id": "x1", "content": "Imported", "source": "manual"}]},
        user_id="bob",
        agent_name="coder",
    )
    assert [f["id"] for f in imported["facts"]] == ["x1"] and set(imported) == DOC_KEYS
    assert manager.warm() is True
    assert manager.shutdown_flush(1.0) is True  # nothing spooled
    manager.delete_memory(user_id="bob", agent_name="coder")
    assert manager.get_memory(user_id="bob", agent_name="coder")["facts"] == []


def test_async_boundary(made: Any) -> None:
    import asyncio

    manager, settings = made()
    seed(settings)

    async def calls() -> tuple[str, list[dict[str, Any]]]:
        turn = [HumanMessage("I prefer uv."), AIMessage("Noted: uv.")]
        await manager.aadd("t-async", turn, agent_name="coder", user_id=ALICE)
        context = await manager.aget_context(ALICE, agent_name="coder")
        return context, await manager.asearch("uv", user_id=ALICE, agent_name="coder")

    context, found = asyncio.run(calls())
    assert "Prefers uv over pip" in context and [f["id"] for f in found] == ["f_uv"]
    assert QueueClient(settings, manager._redis).stats()["due"] == 1


def test_clear_an_agent_keeps_user_summaries_clear_all_removes_all(made: Any) -> None:
    manager, settings = made()
    seed(settings)
    cleared = manager.clear_memory(user_id=ALICE, agent_name="coder")
    assert set(cleared) == DOC_KEYS and cleared["facts"] == []
    assert manager.get_memory(user_id=ALICE, agent_name="coder")["facts"] == []
    summary = manager.get_memory(user_id=ALICE)["user"]["workContext"]["summary"]
    assert summary == "Backend engineer at Acme"
    seed(settings)
    manager.clear_memory(user_id=ALICE)
    assert manager.get_memory(user_id=ALICE)["user"]["workContext"]["summary"] == ""
    assert manager.get_memory(user_id=ALICE, agent_name="coder")["facts"] == []


def test_errors_are_mapped_as_the_gateway_expects(made: Any, storage_kind: str) -> None:
    manager, settings = made()
    seed(settings)
    scope = {"user_id": ALICE, "agent_name": "coder"}
    gw = callsites.gateway
    assert gw(lambda: manager.delete_fact("nope", **scope))[0] == 404
    assert gw(lambda: manager.update_fact("nope", content="x", **scope))[0] == 404
    assert gw(lambda: manager.create_fact("   ", **scope)) == (
        400,
        "Memory fact content cannot be empty.",
    )
    assert gw(lambda: manager.create_fact("ok", confidence=1.5, **scope))[1].startswith(
        "Invalid confidence"
    )
    assert gw(lambda: manager.update_fact("f_uv", confidence=-1, **scope))[0] == 400
    assert gw(lambda: manager.create_fact("prefers UV over pip ", **scope)) == (
        409,
        "A fact with the same content already exists.",
    )
    if storage_kind == "file":
        path = next(Path(settings.storage_dir).rglob("*.json"))
        path.write_text("{not json", encoding="utf-8")
        broken = "bob" if "bob" in str(path) else ALICE
        agent = "coder" if "coder" in str(path) else None
        status, _ = gw(lambda: manager.get_memory(user_id=broken, agent_name=agent))
        assert status == 500
        assert callsites.memory_context(manager, broken, agent) == ""


def test_racing_adds_of_one_fact_store_it_once(made: Any) -> None:
    manager, _ = made()
    barrier = threading.Barrier(6)
    statuses: list[int] = []

    def add() -> None:
        barrier.wait()
        status, _ = callsites.gateway(
            lambda: manager.create_fact("Likes green tea", user_id="zoe", agent_name="coder")
        )
        statuses.append(status)

    threads = [threading.Thread(target=add) for _ in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert sorted(statuses) == [200, 409, 409, 409, 409, 409]
    assert len(manager.get_memory(user_id="zoe", agent_name="coder")["facts"]) == 1


def test_host_hidden_message_hook_is_applied(made: Any) -> None:
    manager, settings = made()
    kept: list[Any] = []
    manager._keep_hidden = lambda extra: kept.append(extra) or extra.get("keep") is True
    queue = QueueClient(settings, manager._redis)
    messages = [
        HumanMessage("reminder", additional_kwargs={"hide_from_ui": True}),
        HumanMessage("I choose option B", additional_kwargs={"hide_from_ui": True, "keep": True}),
        AIMessage("Option B it is."),
    ]
    callsites.after_agent(manager, "t-h", messages, agent_name="coder", user_id=ALICE)
    assert len(kept) == 2
    assert queue.stats()["due"] == 1


def test_shutdown_flush_with_redis_down_then_up(tmp_path: Path, make_settings: Any) -> None:
    server = RedisServer(tmp_path / "redis", appendonly=True).start()
    try:
        settings = make_settings(redis_url=server.url, producer_timeout_seconds=0.2)
        manager = build(settings)
        server.stop()
        with pytest.raises(MemoryManagerError):  # Redis does not answer
            manager.warm()
        turn = [HumanMessage("I prefer uv."), AIMessage("Noted: uv.")]
        callsites.after_agent(manager, "t-1", turn, agent_name="coder", user_id=ALICE)
        assert manager._producer.spool_size == 1
        assert manager.shutdown_flush(0.5) is False  # Redis is down: not handed over
        # The bounded hand-over may return while its last try is still failing: the turn goes
        # back into the spool, never lost.
        wait_for(lambda: manager._producer.spool_size == 1, what="the turn spooled again")
        server.start()
        assert manager.shutdown_flush(10.0) is True
        assert manager._producer.spool_size == 0
        client = manager._redis
        assert QueueClient(settings, client).stats()["due"] == 1
        manager.close()
    finally:
        server.stop()


@pytest.mark.e2e
def test_add_langchain_messages_end_to_end_to_get_context(
    make_settings: Any, openai_server: ScriptedOpenAI, celery_procs: CeleryProcs
) -> None:
    openai_server.responder = lambda request: Reply(
        content=update_answer("The user runs Postgres 16 in production")
    )
    settings = stack_settings(make_settings, openai_server)
    manager = build(settings)
    celery_procs.start_worker(memq_env(settings))
    celery_procs.start_beat(memq_env(settings))
    messages = [
        SystemMessage("You are helpful."),
        HumanMessage("We run Postgres 16 in production."),
        AIMessage("", tool_calls=[{"name": "lookup", "args": {}, "id": "c1"}]),
        ToolMessage("ok", tool_call_id="c1"),
        AIMessage("Good to know: Postgres 16."),
    ]
    callsites.after_agent(
        manager, "thread-9", messages, agent_name="coder", user_id=ALICE, trace_id="tr-1"
    )
    wait_for(
        lambda: "Postgres 16" in manager.get_context(ALICE, agent_name="coder"),
        what="the fact in get_context",
    )
    conversation = openai_server.requests[0]["messages"][-1]["content"]
    assert "We run Postgres 16" in conversation and "You are helpful" not in conversation
    # The summarisation hook's flush goes through the same queue, due at once.
    callsites.summarization_flush(
        manager,
        "thread-9",
        [HumanMessage("Also, I deploy on Fly.io."), AIMessage("Fly.io, noted.")],
        agent_name="coder",
        user_id=ALICE,
    )
    wait_for(lambda: len(openai_server.requests) >= 2, what="the flushed run")
    manager.close()


@pytest.mark.e2e
@pytest.mark.parametrize("action", ["clear_memory", "delete_fact"])
def test_clear_or_delete_is_not_undone_by_an_extraction_in_flight(
    make_settings: Any, openai_server: ScriptedOpenAI, celery_procs: CeleryProcs, action: str
) -> None:
    started, release = threading.Event(), threading.Event()

    def held(request: dict[str, Any]) -> Reply:
        started.set()
        release.wait(20)
        return Reply(content=update_answer("The user owns a red bicycle"))

    openai_server.responder = held
    settings = stack_settings(make_settings, openai_server)
    manager = build(settings)
    seed(settings)
    _, bike = manager.create_fact(
        "The user owns a red bicycle", "context", 0.9, user_id=ALICE, agent_name="coder"
    )
    assert bike is not None
    celery_procs.start_worker(memq_env(settings))
    celery_procs.start_beat(memq_env(settings))
    # The run in flight re-learns the fact from the conversation the user is erasing it from.
    turn = [HumanMessage("I own a red bicycle."), AIMessage("A red bicycle, noted.")]
    callsites.after_agent(manager, "t-b", turn, agent_name="coder", user_id=ALICE)
    wait_for(started.is_set, what="the extraction to reach the model")
    if action == "clear_memory":
        manager.clear_memory(user_id=ALICE, agent_name="coder")
    else:
        manager.delete_fact(bike, user_id=ALICE, agent_name="coder")
    release.set()
    queue = QueueClient(settings, manager._redis)
    wait_for(lambda: queue_idle(queue), what="the run to settle")
    facts = [f["content"] for f in manager.get_memory(user_id=ALICE, agent_name="coder")["facts"]]
    assert "The user owns a red bicycle" not in facts
    manager.close()


def test_create_fact_uses_the_one_vocabulary(made: Any) -> None:
    """DeerFlow's create_fact stored "Correction" as an unknown category and accepted
    "Likes  green tea" beside "likes green tea"; an extraction saw a correction and one fact."""
    manager, _ = made()
    manager.create_fact("likes green tea", user_id="zoe")
    status, _ = callsites.gateway(lambda: manager.create_fact("Likes  green TEA", user_id="zoe"))
    assert status == 409
    manager.create_fact("Use uv, not pip", category="Correction", user_id="zoe")
    facts = manager.get_memory(user_id="zoe")["facts"]
    assert sorted(f["category"] for f in facts) == ["context", "correction"]


def test_deerflows_default_user_is_the_anonymous_user_the_importer_fills(
    made: Any, tmp_path: Path
) -> None:
    """DeerFlow names its user without login ``"default"`` (and some call sites pass None): both
    are memq's anonymous user, whose memory ``memq import --deerflow`` fills from DeerFlow's
    ``users/default`` folder, so a deployment without login keeps seeing its memory after the
    switch. A user named ``default`` inside memq is a different one and sees none of it."""
    import json

    from memq.core.identity import ANONYMOUS_USER_ID, ContextKey
    from memq.integrations.deerflow_import import import_folder

    manager, settings = made()
    legacy = tmp_path / "deerflow" / "users" / "default" / "memory.json"
    legacy.parent.mkdir(parents=True)
    fact = {"id": "fact_uv", "content": "Uses uv instead of pip", "category": "preference",
            "confidence": 0.9, "createdAt": "2026-07-14T09:00:00Z", "source": "t-1"}  # fmt: skip
    legacy.write_text(json.dumps({"version": "1.0", "facts": [fact]}), encoding="utf-8")
    store = get_storage(settings, redis=manager._redis)
    import_folder(store, tmp_path / "deerflow")

    for user in ("default", None):
        assert [f["content"] for f in manager.get_memory(user_id=user)["facts"]] == [
            "Uses uv instead of pip"
        ]
        assert "Uses uv instead of pip" in manager.get_context(user)
    assert store.load("default").facts == []  # memq's own literal "default" user: untouched

    callsites.after_agent(
        manager,
        "t-d",
        [HumanMessage("I moved to Berlin"), AIMessage("Noted.")],
        agent_name=None,
        user_id="default",
    )
    keys = list(manager._redis.scan_iter(match=f"{settings.key_prefix}*ctx:*"))
    [key] = [k for k in keys if ":ctx:" in k]
    assert key.endswith(":ctx:t-d:default:")  # the anonymous user's, not "%64efault"
    assert ContextKey.from_id("t-d:default:").user_id == ANONYMOUS_USER_ID
    assert manager.discard_pending_updates(user_id="default", agent_name=None) == 1
