"""MemoryManager: fact CRUD, search, export/import, clear, forget and history, on both backends."""

from __future__ import annotations

import json
from typing import Any

import pytest

from memq.cli import main
from memq.core.errors import FactEvicted, FactNotFound, InvalidMemoryData
from memq.core.settings import MemqSettings
from storage import get_storage
from storage.files import FileMemoryStorage
from storage.management import MemoryManager
from storage.redis_store import RedisMemoryStorage
from tests.support.documents import DEERFLOW_MEMORY_JSON


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


def corrupt(manager: MemoryManager, user: str) -> None:
    """What a crash, a full disk or a bad hand edit leaves behind."""
    storage = manager.storage
    if isinstance(storage, FileMemoryStorage):
        storage.path(user).write_text('{"facts": [{"content": "trunc', encoding="utf-8")
    else:
        assert isinstance(storage, RedisMemoryStorage)
        storage.redis.hset(storage.keys.memory_document(user, None), "doc", '{"facts": [')


def test_import_replaces_a_corrupt_document_at_the_first_try(manager: MemoryManager) -> None:
    manager.add_fact("alice", "Likes tea")
    corrupt(manager, "alice")

    document = manager.import_document("alice", {"facts": [{"content": "Uses uv"}]})

    assert [f.content for f in document.facts] == ["Uses uv"]
    assert [f.content for f in manager.list_facts("alice")] == ["Uses uv"]
    assert [c.action for c in manager.history("alice")] == ["import", "add"]  # history kept


def test_clear_replaces_a_corrupt_document(manager: MemoryManager) -> None:
    manager.add_fact("alice", "Likes tea")
    corrupt(manager, "alice")

    assert manager.clear("alice") == 0  # nothing readable was there to count

    assert manager.document("alice").is_empty()
    assert [c.action for c in manager.history("alice")] == ["clear", "add"]


def test_import_over_a_corrupt_file_keeps_the_corrupt_copy(make_settings: Any) -> None:
    storage = FileMemoryStorage(make_settings())
    manager = MemoryManager(storage)
    manager.add_fact("alice", "Likes tea")
    corrupt(manager, "alice")

    manager.import_document("alice", {"facts": [{"content": "Uses uv"}]})

    (aside,) = storage.path("alice").parent.glob("memory.json.corrupt-*")
    assert "trunc" in aside.read_text("utf-8")


def test_add_fact_applies_the_fact_cap(manager: MemoryManager) -> None:
    capped = MemoryManager(manager.storage, max_facts=3)
    for content, confidence in (("a", 0.9), ("b", 0.6), ("c", 0.8)):
        capped.add_fact("alice", content, confidence=confidence)

    capped.add_fact("alice", "d", confidence=0.7)  # evicts b, the lowest

    assert sorted(f.content for f in capped.list_facts("alice")) == ["a", "c", "d"]
    evict, add = capped.history("alice", limit=2)
    assert (evict.action, evict.content) == ("evict", "b")
    assert "max_facts=3" in evict.reason and (add.action, add.content) == ("add", "d")


def test_a_fact_the_cap_evicts_at_once_is_reported(manager: MemoryManager) -> None:
    capped = MemoryManager(manager.storage, max_facts=2)
    capped.add_fact("alice", "a", confidence=0.9)
    capped.add_fact("alice", "b", category="correction", confidence=0.3)

    with pytest.raises(FactEvicted, match="cap of 2"):
        capped.add_fact("alice", "c", confidence=0.5)

    assert sorted(f.content for f in capped.list_facts("alice")) == ["a", "b"]
    assert [c.content for c in capped.history("alice")] == ["b", "a"]  # no trace of c


def test_cli_facts_add_says_when_the_cap_evicted_the_fact(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Any
) -> None:
    monkeypatch.setenv("MEMQ_STORAGE", "file")
    monkeypatch.setenv("MEMQ_STORAGE_DIR", str(tmp_path / "memory"))
    monkeypatch.setenv("MEMQ_MAX_FACTS", "10")
    for i in range(10):
        assert main(["facts", "add", "alice", f"fact {i}", "--confidence", "0.9"]) == 0
    capsys.readouterr()

    code = main(["facts", "add", "alice", "a weak guess", "--confidence", "0.2"])

    _, err = capsys.readouterr()
    assert code == 1
    assert "not added" in err and "cap of 10" in err
    facts = FileMemoryStorage(MemqSettings(storage_dir=tmp_path / "memory")).load("alice").facts
    assert len(facts) == 10 and "a weak guess" not in [f.content for f in facts]
