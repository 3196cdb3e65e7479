"""MemoryManager: fact CRUD, search, export/import, clear, forget and history, on both backends."""

from __future__ import annotations

import json
from typing import Any

import pytest

from core.errors import FactNotFound, InvalidMemoryData
from storage import get_storage
from storage.management import MemoryManager
from tests.test_storage_file import DEERFLOW_MEMORY_JSON


@pytest.fixture(params=["file", pytest.param("redis", marks=pytest.mark.integration)])
def manager(request: pytest.FixtureRequest, make_settings: Any) -> MemoryManager:
    return MemoryManager(get_storage(make_settings(storage=request.param)))


def test_add_list_and_search(manager: MemoryManager) -> None:
    manager.add_fact("alice", "Prefers Python over Go", category="preference", confidence=0.6)
    manager.add_fact("alice", "Uses PYTHON 3.12 at work", category="knowledge", confidence=0.9)
    manager.add_fact("alice", "Likes tea", confidence=0.95)
    manager.add_fact("alice", "python everywhere", agent_name="coder", confidence=0.99)

    assert [f.content for f in manager.list_facts("alice")] == [
        "Likes tea",
        "Uses PYTHON 3.12 at work",
        "Prefers Python over Go",
    ]
    found = manager.search("alice", "  python ")
    assert [f.content for f in found] == ["Uses PYTHON 3.12 at work", "Prefers Python over Go"]
    assert [f.content for f in manager.search("alice", "python", category="preference")] == [
        "Prefers Python over Go"
    ]
    assert len(manager.search("alice", "python", limit=1)) == 1
    assert manager.search("alice", "   ") == []
    assert [f.content for f in manager.search("alice", "python", agent_name="coder")] == [
        "python everywhere"
    ]
    tea = manager.list_facts("alice")[0]
    assert (tea.category, tea.source) == ("context", "manual")


@pytest.mark.parametrize(
    ("content", "confidence"),
    [("   ", 0.5), ("ok", 1.5), ("ok", -0.1), ("ok", float("nan")), ("ok", True)],
)
def test_invalid_facts_are_refused(manager: MemoryManager, content: str, confidence: float) -> None:
    with pytest.raises(InvalidMemoryData) as excinfo:
        manager.add_fact("alice", content, confidence=confidence)
    assert isinstance(excinfo.value, ValueError)
    assert manager.list_facts("alice") == []


def test_edit_changes_only_the_given_fields(manager: MemoryManager) -> None:
    added = manager.add_fact("alice", "Uses pip", category="preference", confidence=0.7)
    edited = manager.edit_fact("alice", added.id, content="Uses uv")

    assert (edited.content, edited.category, edited.confidence) == ("Uses uv", "preference", 0.7)
    assert edited.created_at == added.created_at
    assert manager.edit_fact("alice", added.id, category="  ").category == "context"
    with pytest.raises(InvalidMemoryData):
        manager.edit_fact("alice", added.id, confidence=2)
    with pytest.raises(FactNotFound, match="fact_nope"):
        manager.edit_fact("alice", "fact_nope", content="x")
    assert [f.content for f in manager.list_facts("alice")] == ["Uses uv"]


def test_delete_a_fact(manager: MemoryManager) -> None:
    keep = manager.add_fact("alice", "keep")
    gone = manager.add_fact("alice", "gone")
    assert manager.delete_fact("alice", gone.id).content == "gone"
    assert [f.id for f in manager.list_facts("alice")] == [keep.id]
    with pytest.raises(FactNotFound):
        manager.delete_fact("alice", gone.id)


def test_export_then_import_round_trips(manager: MemoryManager) -> None:
    manager.add_fact("alice", "Likes tea", confidence=0.8)
    exported = manager.export("alice")
    text = json.dumps(exported)

    manager.import_document("bob", text, agent_name="coder")
    assert [f.content for f in manager.list_facts("bob", agent_name="coder")] == ["Likes tea"]
    assert manager.export("bob", agent_name="coder")["facts"] == exported["facts"]


def test_import_a_deerflow_memory_json(manager: MemoryManager) -> None:
    document = manager.import_document("alice", DEERFLOW_MEMORY_JSON)
    assert len(document.facts) == 3
    assert manager.search("alice", "make dev")[0].source_error == "The agent suggested npm start"
    assert manager.history("alice")[0].action == "import"


@pytest.mark.parametrize(
    "data",
    ["not json", "[1, 2]", '{"something": "else"}', '{"facts": "nope"}', '{"user": []}'],
)
def test_invalid_import_is_refused_and_changes_nothing(manager: MemoryManager, data: str) -> None:
    manager.add_fact("alice", "precious")
    with pytest.raises(InvalidMemoryData):
        manager.import_document("alice", data)
    assert [f.content for f in manager.list_facts("alice")] == ["precious"]


def test_import_gives_duplicate_fact_ids_new_ones(manager: MemoryManager) -> None:
    data = {"facts": [{"id": "fact_1", "content": "a"}, {"id": "fact_1", "content": "b"}]}
    ids = [f.id for f in manager.import_document("alice", data).facts]
    assert ids[0] == "fact_1" and ids[1] != "fact_1"


def test_every_change_is_in_the_history(manager: MemoryManager) -> None:
    fact = manager.add_fact("alice", "Uses pip")
    manager.edit_fact("alice", fact.id, content="Uses uv")
    manager.delete_fact("alice", fact.id)
    manager.add_fact("alice", "Likes tea")
    assert manager.clear("alice") == 1

    history = manager.history("alice")
    assert [c.action for c in history] == ["clear", "add", "remove", "edit", "add"]
    assert history[3].fact_id == fact.id and history[3].content == "Uses uv"
    assert history[0].reason == "cleared 1 facts"
    assert manager.list_facts("alice") == []


def test_forget_removes_every_agent_and_history_of_that_user_only(
    manager: MemoryManager,
) -> None:
    manager.add_fact("alice", "global")
    manager.add_fact("alice", "coder fact", agent_name="coder")
    manager.add_fact("alice", "writer fact", agent_name="writer")
    manager.add_fact("bob", "bob fact", agent_name="coder")
    assert manager.list_users() == ["alice", "bob"]
    assert manager.list_agents("alice") == [None, "coder", "writer"]

    assert manager.forget("alice") == 3

    assert manager.list_users() == ["bob"]
    assert manager.list_agents("alice") == []
    for agent in (None, "coder", "writer"):
        assert manager.list_facts("alice", agent_name=agent) == []
        assert manager.history("alice", agent_name=agent) == []
    assert [f.content for f in manager.list_facts("bob", agent_name="coder")] == ["bob fact"]
    assert manager.forget("alice") == 0
