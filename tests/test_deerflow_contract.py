"""DeerFlow's own memory tests (bytedance/deer-flow f1f4af99b, ``backend/tests/``), ported to memq.

Each case is built through DeerFlow's factory as the stand-in re-states it
(``MemoryConfig(manager_class=...)`` + ``get_memory_manager()``, which injects ``storage_path``)
and asserts on memq's state instead of on DeerMem's files or a ``MagicMock``'s calls. The
docstring of each test names the DeerFlow test it comes from.

Adapted (DeerFlow asserts on DeerMem internals; the behaviour is asserted on memq instead):
- ``test_memory_search.py`` seeds facts through a mock of DeerMem's ``_updater``; here they are
  stored. DeerMem's search is a substring match; memq's is BM25 over words, so the queries are
  whole words (``"python"``, not ``"pyth"``).
- ``test_memory_router.py::test_settings_fact_crud_without_agent_name_uses_default_agent`` and
  ``test_import_route_without_agent_name_persists_default_bucket_markdown`` write or inspect
  DeerMem's Markdown files; here the legacy document is imported and read back through the
  manager (reading DeerMem's folders is ``memq import --deerflow``'s job, tested elsewhere).
- ``test_memory_manager_pluggable.py``'s DeerMem-only cases (``_queue.flush_sync``, the
  ``deermem`` registry name, ``delete_memory``/``export_memory`` being stubs there) become the
  same promise on memq: shutdown hands the spool over, memq implements both calls.
- ``test_custom_agent.py``'s deletion cases run through the stand-in's agent deletion, which
  probes ``discard_pending_updates`` (DeerFlow PR #4926, not yet merged at f1f4af99b).

Skipped, and why:
- DeerFlow tests written purely against a ``MagicMock`` manager (most of ``test_memory_router.py``,
  ``test_memory_tools.py``, ``test_memory_middleware.py``, ``test_gateway_lifespan_shutdown.py``,
  ``test_dynamic_context_middleware.py``) test DeerFlow's own routing; only the backend-facing
  promise each one relies on is ported.
- ``test_memory_upload_filtering.py``'s ``<current_uploads>`` cases: the producer's upload filter
  owns them (``tests/test_producer*.py``); the ``<uploaded_files>`` case is ported here.
"""

from __future__ import annotations

import asyncio
import sys
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from langchain_core.messages import AIMessage, HumanMessage

from memq.core.settings import MemqSettings
from memq.local.redis_server import RedisServer
from storage import get_storage
from storage.document import MemoryDocument
from storage.sections import Section
from worker.queue import QueueClient

STANDIN = Path(__file__).parent / "support" / "deerflow_standin"
if str(STANDIN) not in sys.path:
    sys.path.insert(0, str(STANDIN))

from deerflow import callsites  # noqa: E402
from deerflow.agents.memory import (  # noqa: E402
    MemoryManagerError,
    get_memory_manager,
    reset_memory_manager,
)
from deerflow.config.memory_config import MemoryConfig, set_memory_config  # noqa: E402

from memq.integrations.deerflow import MemqMemoryManager  # noqa: E402

pytestmark = pytest.mark.integration

MANAGER_CLASS = "memq.integrations.deerflow:MemqMemoryManager"
Factory = Callable[..., MemqMemoryManager]


def memq_config(settings: MemqSettings, **extra: Any) -> dict[str, Any]:
    values: dict[str, Any] = {
        "redis_url": settings.redis_url,
        "key_prefix": settings.key_prefix,
        "storage": settings.storage,
        "storage_dir": str(settings.storage_dir),
        "llm_provider": "rules",
    }
    values.update(extra)
    return {k: v for k, v in values.items() if v is not None}


@pytest.fixture(params=["file", "redis"])
def storage_kind(request: pytest.FixtureRequest) -> str:
    return str(request.param)


@pytest.fixture
def deerflow(
    make_settings: Any, storage_kind: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[Factory]:
    """``deerflow(**backend_config)``: memq built by DeerFlow's factory, DeerFlow's home in
    ``tmp_path / "home"``; ``settings`` of the test are on ``factory.settings``."""
    monkeypatch.setenv("DEER_FLOW_HOME", str(tmp_path / "home"))
    settings = make_settings(storage=storage_kind)
    built: list[MemqMemoryManager] = []

    def factory(*, mode: str = "middleware", **overrides: Any) -> MemqMemoryManager:
        reset_memory_manager()
        config = memq_config(settings, **overrides)
        set_memory_config(
            MemoryConfig(manager_class=MANAGER_CLASS, mode=mode, backend_config=config)
        )  # type: ignore[arg-type]
        manager = get_memory_manager()
        assert isinstance(manager, MemqMemoryManager)
        built.append(manager)
        return manager

    factory.settings = settings  # type: ignore[attr-defined]
    yield factory
    reset_memory_manager()
    set_memory_config(MemoryConfig())
    for manager in built:
        manager.close()


def _fact(content: str, category: str = "context", confidence: float = 0.7) -> dict[str, Any]:
    return {
        "id": f"fact_{abs(hash(content)) & 0xFFFFFFFF:08x}",
        "content": content,
        "category": category,
        "confidence": confidence,
        "createdAt": "2026-07-09T00:00:00Z",
        "source": "test",
    }


def _with_facts(manager: MemqMemoryManager, facts: list[dict[str, Any]], **scope: Any) -> None:
    manager.import_memory({"facts": facts}, **scope)


# --- test_memory_manager_pluggable.py


def test_resolves_memq_by_dotted_path(deerflow: Factory) -> None:
    """test_memory_manager_pluggable.py::test_resolves_configured_backend (the dotted-path form)."""
    manager = deerflow()
    assert type(manager).__name__ == "MemqMemoryManager"
    assert get_memory_manager() is manager  # one instance per process


def test_unknown_class_raises_instead_of_falling_back(deerflow: Factory) -> None:
    """test_memory_manager_pluggable.py::test_unknown_backend_raises_instead_of_falling_back."""
    reset_memory_manager()
    set_memory_config(MemoryConfig(manager_class="memq.integrations.deerflow:NoSuchManager"))
    with pytest.raises(ValueError, match="NoSuchManager"):
        get_memory_manager()


def test_storage_path_that_is_an_existing_file_fails_at_construction(
    deerflow: Factory, tmp_path: Path
) -> None:
    """test_memory_manager_pluggable.py::test_factory_raises_when_storage_path_is_existing_file:
    a file where the memory folder should be is a configuration error at startup, not an
    ``OSError`` on every later call."""
    path = tmp_path / "mem.json"
    path.write_text("{}", encoding="utf-8")
    with pytest.raises(ValueError, match="existing file"):
        deerflow(storage_dir=None, storage_path=str(path))
    # memq's own name for the folder gets the same check.
    with pytest.raises(ValueError, match="existing file"):
        deerflow(storage_dir=str(path), storage="file")


def test_no_storage_path_lands_under_deerflows_home(deerflow: Factory, tmp_path: Path) -> None:
    """test_memory_manager_pluggable.py::test_empty_storage_path_factory_injects_runtime_home:
    memq's files go beside DeerFlow's own, under its home, when nothing names a folder."""
    manager = deerflow(storage_dir=None, storage="file")
    assert manager.settings.storage_dir == tmp_path / "home" / "memq"
    manager.create_fact("hello", user_id="u1", agent_name="test-agent")
    assert list((tmp_path / "home" / "memq").rglob("*.json"))


def test_shutdown_flush_and_delete_export_are_implemented(deerflow: Factory) -> None:
    """test_memory_manager_pluggable.py::test_shutdown_flush_has_default_and_noop_is_noop_success
    and ::test_deermem_search_works_delete_export_are_stubs (memq implements both)."""
    manager = deerflow()
    assert manager.shutdown_flush(1.0) is True
    manager.create_fact("Likes tea", user_id="u")
    assert [f["content"] for f in manager.export_memory(user_id="u")["facts"]] == ["Likes tea"]
    manager.delete_memory(user_id="u")
    assert manager.export_memory(user_id="u")["facts"] == []


# --- test_memory_manager_interface.py


def test_from_config_takes_the_host_hooks_it_needs(deerflow: Factory) -> None:
    """test_memory_manager_interface.py::test_from_config_consumes_host_hooks_it_needs."""
    from deerflow.agents.memory.manager import MemoryCallbacks

    config = memq_config(deerflow.settings)  # type: ignore[attr-defined]
    manager = MemqMemoryManager.from_config(
        config,
        mode="middleware",
        callbacks=MemoryCallbacks(),
        host_llm_factory=lambda: None,
        should_keep_hidden_message=lambda extra: True,
        trace_context_manager=None,
        extraction_callback=lambda payload: None,
    )
    assert manager.backend_config == config and manager.mode == "middleware"
    manager.close()


def test_async_calls_reach_memq(deerflow: Factory) -> None:
    """test_memory_manager_interface.py::test_async_defaults_delegate_to_sync."""
    manager = deerflow()
    _with_facts(manager, [_fact("User prefers Python", "preference", 0.9)], user_id="u")

    async def calls() -> tuple[str, list[dict[str, Any]]]:
        await manager.aadd("t", [HumanMessage("hi, I use uv"), AIMessage("ok")], user_id="u")
        return await manager.aget_context("u"), await manager.asearch("python", user_id="u")

    context, found = asyncio.run(calls())
    assert "User prefers Python" in context and len(found) == 1


# --- test_memory_router.py


def test_settings_fact_crud_without_agent_name(deerflow: Factory) -> None:
    """test_memory_router.py::test_settings_fact_crud_without_agent_name_uses_default_agent: the
    settings page sends no agent name; facts come newest first, as DeerMem returns them (the
    page shows them in the order returned)."""
    manager = deerflow()
    gateway = callsites.gateway
    legacy = {**_fact("Legacy global fact", confidence=0.9), "id": "fact_legacy"}
    legacy["source"] = "manual"
    _with_facts(manager, [legacy], user_id="alice")
    assert [f["content"] for f in manager.get_memory(user_id="alice")["facts"]] == [
        "Legacy global fact"
    ]
    status, created = gateway(
        lambda: manager.create_fact("Project uses Python", "context", 0.8, user_id="alice")
    )
    assert status == 200
    assert all(isinstance(fact["source"], str) for fact in created["facts"])
    fact_id = next(f["id"] for f in created["facts"] if f["content"] == "Project uses Python")
    status, updated = gateway(
        lambda: manager.update_fact(fact_id, content="Project uses Python 3.12", user_id="alice")
    )
    assert status == 200
    assert updated["facts"][0]["content"] == "Project uses Python 3.12"  # newest first
    status, deleted = gateway(lambda: manager.delete_fact(fact_id, user_id="alice"))
    assert [f["id"] for f in deleted["facts"]] == ["fact_legacy"]
    _, deleted = gateway(lambda: manager.delete_fact("fact_legacy", user_id="alice"))
    assert deleted["facts"] == []


def test_facts_come_newest_first(deerflow: Factory) -> None:
    """test_memory_router.py::test_settings_fact_crud_without_agent_name_uses_default_agent (the
    order it relies on), for every call returning a document."""
    manager = deerflow()
    old = {**_fact("Old fact"), "createdAt": "2026-01-01T00:00:00Z"}
    new = {**_fact("New fact"), "createdAt": "2026-06-01T00:00:00Z"}
    _with_facts(manager, [old, new], user_id="u", agent_name="coder")
    scope = {"user_id": "u", "agent_name": "coder"}
    assert [f["content"] for f in manager.get_memory(**scope)["facts"]] == ["New fact", "Old fact"]
    created, _ = manager.create_fact("Newest fact", **scope)
    assert [f["content"] for f in created["facts"]] == ["Newest fact", "New fact", "Old fact"]
    assert manager.export_memory(**scope)["facts"] == created["facts"]


def test_import_route_without_agent_name_reads_back(deerflow: Factory) -> None:
    """test_memory_router.py::test_import_route_without_agent_name_persists_default_bucket_markdown
    and ::test_import_memory_route_preserves_source_error."""
    manager = deerflow()
    fact = {**_fact("User works on DeerFlow"), "id": "fact_gateway_import"}
    fact["sourceError"] = "The agent previously suggested npm start."
    status, imported = callsites.gateway(
        lambda: manager.import_memory({"version": "1.0", "facts": [fact]}, user_id="alice")
    )
    assert status == 200
    [stored] = manager.get_memory(user_id="alice")["facts"]
    assert stored["id"] == "fact_gateway_import" and stored["sourceError"] == fact["sourceError"]
    assert imported["facts"] == [stored]


def test_import_of_an_empty_object_is_accepted(deerflow: Factory) -> None:
    """test_memory_router.py::test_import_memory_route_returns_imported_memory with the smallest
    body DeerMem accepts: ``{}`` is an empty memory, not an error."""
    manager = deerflow()
    _with_facts(manager, [_fact("Goes away")], user_id="u")
    status, document = callsites.gateway(lambda: manager.import_memory({}, user_id="u"))
    assert status == 200 and document["facts"] == []
    assert manager.get_memory(user_id="u")["facts"] == []


def test_clear_and_get_of_an_agent_keep_the_user_summaries(deerflow: Factory) -> None:
    """test_memory_router.py::test_clear_memory_route_returns_cleared_memory, per agent: the
    user-level summaries belong to the user, not to the agent being cleared, and an agent's
    document shows them (DeerMem's storage holds them once per user)."""
    manager = deerflow()
    store = get_storage(deerflow.settings)  # type: ignore[attr-defined]
    store.save(
        "u", None, MemoryDocument(user={"work_context": Section(summary="Engineer at Acme")})
    )
    _with_facts(manager, [_fact("Agent fact")], user_id="u", agent_name="coder")
    scope = {"user_id": "u", "agent_name": "coder"}
    document = manager.get_memory(**scope)
    assert document["user"]["workContext"]["summary"] == "Engineer at Acme"
    assert [f["content"] for f in document["facts"]] == ["Agent fact"]
    status, cleared = callsites.gateway(lambda: manager.clear_memory(**scope))
    assert status == 200 and cleared["facts"] == []
    assert cleared["user"]["workContext"]["summary"] == "Engineer at Acme"
    assert manager.get_memory(user_id="u")["user"]["workContext"]["summary"] == "Engineer at Acme"


def test_gateway_error_statuses(deerflow: Factory) -> None:
    """test_memory_router.py::test_create_memory_fact_route_maps_duplicate_to_409,
    ::test_delete_memory_fact_route_returns_404_for_missing_fact,
    ::test_update_memory_fact_route_returns_404_for_missing_fact,
    ::test_update_memory_fact_route_returns_specific_error_for_invalid_confidence and
    ::test_update_memory_fact_route_preserves_omitted_fields."""
    manager = deerflow()
    gateway = callsites.gateway
    _, fact_id = manager.create_fact("Prefers tabs", "preference", 0.8, user_id="u")
    assert fact_id is not None
    assert gateway(lambda: manager.create_fact("prefers tabs", user_id="u"))[0] == 409
    assert gateway(lambda: manager.delete_fact("nope", user_id="u"))[0] == 404
    assert gateway(lambda: manager.update_fact("nope", content="x", user_id="u"))[0] == 404
    assert gateway(lambda: manager.update_fact(fact_id, confidence=2.0, user_id="u"))[0] == 400
    _, document = gateway(
        lambda: manager.update_fact(fact_id, content="Prefers spaces", user_id="u")
    )
    [fact] = document["facts"]
    assert (fact["content"], fact["category"], fact["confidence"]) == (
        "Prefers spaces",
        "preference",
        0.8,
    )


# --- test_memory_search.py (facts stored, not mocked)


@pytest.fixture
def searchable(deerflow: Factory) -> MemqMemoryManager:
    manager = deerflow()
    _with_facts(
        manager,
        [
            _fact("User prefers Python", "preference", 0.9),
            _fact("User works with TypeScript", "context", 0.7),
            _fact("User lives in Beijing", "personal", 0.8),
        ],
        user_id="u",
    )
    return manager


def test_search_basic_case_insensitive_empty_and_no_match(searchable: MemqMemoryManager) -> None:
    """test_memory_search.py::TestDeerMemSearch::test_basic_substring_match,
    ::test_case_insensitive, ::test_empty_query_returns_empty, ::test_no_match_returns_empty,
    ::test_non_positive_top_k_returns_empty."""
    [found] = searchable.search("python", user_id="u")
    assert found["content"] == "User prefers Python"
    for query in ("PYTHON", "Python"):
        assert len(searchable.search(query, user_id="u")) == 1
    assert searchable.search("", user_id="u") == []
    assert searchable.search("   ", user_id="u") == []
    assert searchable.search("rust", user_id="u") == []
    assert searchable.search("python", 0, user_id="u") == []
    assert searchable.search("python", -1, user_id="u") == []
    assert searchable.search("python", user_id="nobody") == []  # ::test_no_facts_returns_empty


def test_search_ranks_by_confidence_respects_top_k_and_category(deerflow: Factory) -> None:
    """test_memory_search.py::TestDeerMemSearch::test_sorted_by_confidence_desc,
    ::test_respects_top_k, ::test_category_filters_before_top_k_slice,
    ::test_category_none_returns_all_categories."""
    manager = deerflow()
    _with_facts(
        manager,
        [
            _fact("uv fast", "preference", 0.9),
            _fact("uv tool", "context", 0.95),
            _fact("uv python", "context", 0.9),
            _fact("uv rust", "context", 0.85),
        ],
        user_id="u",
    )
    ranked = manager.search("uv", 10, user_id="u")
    assert [f["confidence"] for f in ranked] == sorted(
        (f["confidence"] for f in ranked), reverse=True
    )
    assert len(manager.search("uv", 2, user_id="u")) == 2
    assert manager.search("uv", top_k=1, user_id="u")[0]["category"] == "context"
    [pref] = manager.search("uv", top_k=1, user_id="u", category="preference")
    assert pref["content"] == "uv fast"
    assert len(manager.search("uv", category=None, user_id="u")) == 4


# --- test_memory_tools.py


def test_memory_tools_against_memq(searchable: MemqMemoryManager) -> None:
    """test_memory_tools.py::TestMemorySearchTool::test_returns_json_with_results,
    ::test_empty_results, ::test_category_filter_forwarded_to_backend,
    TestMemoryAddTool::test_rejects_existing_duplicate_content, ::test_empty_content_returns_error,
    TestMemoryDeleteTool::test_invalid_fact_id_returns_error."""
    tool = callsites.memory_search_tool
    assert '"count": 1' in tool(searchable, "python", user_id="u", agent_name=None)
    assert '"count": 0' in tool(searchable, "rust", user_id="u", agent_name=None)
    out = tool(searchable, "beijing", user_id="u", agent_name=None, category="personal")
    assert '"count": 1' in out and "Beijing" in out
    assert '"count": 0' in tool(
        searchable, "python", user_id="u", agent_name=None, category="personal"
    )
    gateway = callsites.gateway
    assert gateway(lambda: searchable.create_fact("User prefers Python", user_id="u"))[0] == 409
    assert gateway(lambda: searchable.create_fact(" ", user_id="u"))[0] == 400
    assert gateway(lambda: searchable.delete_fact("fact_missing", user_id="u"))[0] == 404


# --- test_memory_upload_filtering.py, test_memory_middleware.py, test_summarization_middleware.py


def test_upload_only_turn_and_its_answer_are_not_queued(deerflow: Factory) -> None:
    """test_memory_upload_filtering.py (the ``<uploaded_files>`` cases) and
    test_memory_middleware.py::test_after_agent_queues_memory_under_runtime_user."""
    manager = deerflow()
    queue = QueueClient(deerflow.settings, manager._redis)  # type: ignore[attr-defined]
    upload = HumanMessage("<uploaded_files>\n/mnt/user-data/uploads/a.pdf\n</uploaded_files>")
    callsites.after_agent(
        manager,
        "t-up",
        [upload, AIMessage("Got the file.")],
        agent_name=None,
        user_id="alice",
    )
    assert queue.stats()["due"] == 0
    turn = [HumanMessage("I deploy on Fly.io"), AIMessage("Fly.io, noted.")]
    callsites.after_agent(manager, "t-1", turn, agent_name=None, user_id="u-1")
    assert queue.stats()["due"] == 1


def test_summarization_flush_is_due_at_once(deerflow: Factory) -> None:
    """test_summarization_middleware.py (the memory flush hook cases): the messages about to be
    summarised away are handed over synchronously and due at once."""
    manager = deerflow(debounce_seconds=600.0, max_delay_seconds=900.0)
    queue = QueueClient(deerflow.settings, manager._redis)  # type: ignore[attr-defined]
    turn = [HumanMessage("I prefer uv."), AIMessage("uv, noted.")]
    callsites.summarization_flush(manager, "t-s", turn, agent_name="coder", user_id="u")
    assert len(queue.claim().claims) == 1  # due now, not after the 600 s debounce


# --- test_gateway_lifespan_shutdown.py


def test_lifespan_warms_flushes_and_closes(deerflow: Factory) -> None:
    """test_gateway_lifespan_shutdown.py::test_lifespan_drains_memory_on_shutdown_with_configured_timeout
    and ::test_lifespan_closes_memory_manager_when_flush_raises."""
    manager = deerflow()
    assert callsites.lifespan_startup(manager) == "warmed"
    turn = [HumanMessage("I prefer uv."), AIMessage("uv, noted.")]
    callsites.after_agent(manager, "t-l", turn, agent_name=None, user_id="u")
    assert callsites.lifespan_shutdown(manager, 2.0) is True
    queue = QueueClient(deerflow.settings, redis.Redis.from_url(deerflow.settings.redis_url))  # type: ignore[attr-defined]
    assert queue.stats()["due"] == 1  # handed over before close


# --- test_memory_prompt_injection.py, test_lead_agent_prompt.py, test_dynamic_context_middleware.py


def test_memory_context_is_wrapped_once_and_empty_is_nothing(deerflow: Factory) -> None:
    """test_lead_agent_prompt.py (the ``_get_memory_context`` cases) and
    test_dynamic_context_middleware.py (``get_context`` without a thread id)."""
    manager = deerflow()
    assert callsites.memory_context(manager, "nobody", None) == ""
    _with_facts(manager, [_fact("User prefers Python", "preference", 0.9)], user_id="u")
    text = callsites.memory_context(manager, "u", None)
    assert text.startswith("<memory>\n") and text.count("<memory>") == 1
    assert "User prefers Python" in text


def test_read_outage_raises_memory_manager_error_for_fail_closed(
    make_settings: Any, tmp_path: Path
) -> None:
    """test_lead_agent_prompt.py (``failure_policy.read: fail_closed`` re-raises only
    ``MemoryManagerError``): a Redis outage must reach it as one, or it is silently swallowed;
    the default policy still gets "" (fail open)."""
    server = RedisServer(tmp_path / "redis", appendonly=False).start()
    try:
        settings = make_settings(redis_url=server.url, storage="redis")
        reset_memory_manager()
        set_memory_config(
            MemoryConfig(manager_class=MANAGER_CLASS, backend_config=memq_config(settings))
        )
        manager = get_memory_manager()
        server.stop()
        closed = {"read": "fail_closed"}
        with pytest.raises(MemoryManagerError):
            callsites.memory_context(manager, "u", None, failure_policy=closed)
        assert callsites.memory_context(manager, "u", None) == ""
        with pytest.raises(MemoryManagerError):
            manager.search("python", user_id="u")
        with pytest.raises(MemoryManagerError):
            manager.warm()
        assert callsites.lifespan_startup(manager) == "error"  # logged; the gateway starts
        manager.close()
    finally:
        server.stop()
        reset_memory_manager()
        set_memory_config(MemoryConfig())


# --- test_custom_agent.py


def test_deleting_an_agent_deletes_its_memory_and_queued_work(
    deerflow: Factory, tmp_path: Path, redis_client: redis.Redis
) -> None:
    """test_custom_agent.py::test_delete_agent and ::test_delete_removes_files_from_disk, with
    the ``discard_pending_updates`` hook DeerFlow probes: a re-created agent of the same name
    starts with no memory, and nothing queued for the old one is extracted into it."""
    manager = deerflow(debounce_seconds=600.0, max_delay_seconds=900.0)
    settings = deerflow.settings  # type: ignore[attr-defined]
    queue = QueueClient(settings, manager._redis)
    agents = tmp_path / "home"
    folder = agents / "users" / "alice" / "agents" / "helper"
    folder.mkdir(parents=True)
    (folder / "config.yaml").write_text("name: helper\n", encoding="utf-8")
    scope = {"user_id": "alice", "agent_name": "helper"}
    manager.create_fact("Old agent's fact", **scope)
    manager.create_fact("User-level fact", user_id="alice")
    manager.create_fact("Other agent's fact", user_id="alice", agent_name="coder")
    turn = [HumanMessage("helper-secret-turn"), AIMessage("ok")]
    callsites.after_agent(manager, "t-1", turn, **scope)
    callsites.after_agent(manager, "t-2", turn, **scope)
    callsites.after_agent(
        manager,
        "t-3",
        [HumanMessage("keep me"), AIMessage("ok")],
        user_id="alice",
        agent_name="coder",
    )
    assert queue.stats()["due"] == 3

    discarded = callsites.delete_custom_agent(manager, agents, **scope)

    assert discarded == 2
    assert not folder.exists()
    assert manager.get_memory(**scope)["facts"] == []
    assert queue.stats()["due"] == 1
    values = [v for k, v in _dump(redis_client).items() if settings.key_prefix in k]
    assert not [v for v in values if "helper-secret-turn" in v]
    # The rest of the user's memory stays.
    assert [f["content"] for f in manager.get_memory(user_id="alice")["facts"]] == [
        "User-level fact"
    ]
    coder = manager.get_memory(user_id="alice", agent_name="coder")["facts"]
    assert [f["content"] for f in coder] == ["Other agent's fact"]
    assert manager.discard_pending_updates(**scope) == 0  # idempotent


def _dump(client: redis.Redis) -> dict[str, str]:
    from memq.testing.redis_dump import dump_redis

    return dump_redis(client)


def test_hung_redis_costs_get_context_one_short_timeout_then_raises_at_once(
    make_settings: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    """test_lead_agent_prompt.py (``failure_policy.read: fail_closed``) against a Redis that
    accepts connections and never answers: the first turn waits one injector timeout, the next
    ones raise ``MemoryManagerError`` at once while the read backs off (Redis not even tried)."""
    from memq.testing.hung_server import HungServer
    from producer import backoff as backoff_module

    monkeypatch.setattr(backoff_module, "BACKOFF_MIN_SECONDS", 600.0)
    monkeypatch.setattr(backoff_module, "BACKOFF_MAX_SECONDS", 600.0)
    with HungServer() as hung:
        settings = make_settings(redis_url=hung.url, storage="redis")
        config = memq_config(settings, injector_timeout_seconds=0.3)
        reset_memory_manager()
        set_memory_config(MemoryConfig(manager_class=MANAGER_CLASS, backend_config=config))
        manager = get_memory_manager()
        closed = {"read": "fail_closed"}
        try:
            with pytest.raises(MemoryManagerError):
                callsites.memory_context(manager, "u", "coder", failure_policy=closed)
            tried = hung.connections
            assert tried >= 1
            for _ in range(10):
                with pytest.raises(MemoryManagerError, match="backing off"):
                    callsites.memory_context(manager, "u", "coder", failure_policy=closed)
                assert callsites.memory_context(manager, "u", "coder") == ""
            assert hung.connections == tried
        finally:
            manager.close()
            reset_memory_manager()
            set_memory_config(MemoryConfig())
