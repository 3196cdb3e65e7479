"""`memq import --deerflow DIR` on DeerFlow memory folders built here in both layouts (the older
one-``memory.json``-per-scope layout and DeerFlow's current storage v2 with one Markdown file per
fact, written as DeerFlow f1f4af99b renders them), run twice: the second run adds nothing."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from memq.cli import main
from memq.core.settings import MemqSettings
from memq.integrations.deerflow_import import DeerFlowImportError, fact_from_markdown, import_folder
from storage import get_storage

SUMMARIES = {
    "user": {
        "workContext": {"summary": "Backend engineer at Acme", "updatedAt": "2026-07-01T00:00:00Z"},
        "personalContext": {"summary": "", "updatedAt": ""},
        "topOfMind": {"summary": "Migrating to uv", "updatedAt": "2026-07-02T00:00:00Z"},
    },
    "history": {
        "recentMonths": {"summary": "Worked on DeerFlow", "updatedAt": "2026-07-03T00:00:00Z"},
        "earlierContext": {"summary": "", "updatedAt": ""},
        "longTermBackground": {"summary": "", "updatedAt": ""},
    },
}


def v1_fact(fid: str, content: str, **extra: Any) -> dict[str, Any]:
    return {
        "id": fid,
        "content": content,
        "category": "preference",
        "confidence": 0.9,
        "createdAt": "2026-07-14T09:00:00.000000Z",
        "source": "thread-42",
        **extra,
    }


def write_json(path: Path, data: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, ensure_ascii=False, indent=2), encoding="utf-8")


def write_v2_fact(user_dir: Path, agent: str, fact: dict[str, Any], user: str) -> Path:
    """A fact file as DeerFlow's storage v2 writes it: YAML front matter, a title, the content."""
    meta = {k: v for k, v in fact.items() if k != "content"}
    meta.update(user_id=user, agent_name=agent)
    front = yaml.safe_dump(meta, allow_unicode=True, sort_keys=False).strip()
    title = fact["content"].splitlines()[0][:160]
    shard = hashlib.sha256(fact["id"].encode()).hexdigest()[:2]
    path = user_dir / "agents" / agent / "facts" / shard / f"{fact['id']}.md"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(f"---\n{front}\n---\n\n# {title}\n\n{fact['content']}\n", encoding="utf-8")
    return path


def v2_fact(fid: str, content: str, category: str = "preference", **extra: Any) -> dict[str, Any]:
    return {
        "id": fid,
        "schemaVersion": 2,
        "content": content,
        "category": category,
        "confidence": 0.85,
        "status": "active",
        "topics": [],
        "consolidatedFrom": [],
        "revision": 1,
        "source": {"type": "conversation", "threadId": "th-7"},
        "createdAt": "2026-08-01T10:00:00.000000Z",
        "updatedAt": "2026-08-01T10:00:00.000000Z",
        **extra,
    }


def build_old_layout(root: Path) -> None:
    write_json(root / "memory.json", {"version": "1.0", **SUMMARIES,
               "facts": [v1_fact("fact_legacy1", "Uses uv instead of pip")]})  # fmt: skip
    write_json(root / "agents" / "coder" / "memory.json",
               {"facts": [v1_fact("fact_legacy2", "Prefers tabs")]})  # fmt: skip
    write_json(root / "users" / "alice" / "memory.json",
               {**SUMMARIES, "facts": [v1_fact("fact_a1", "Lives in Lisbon")]})  # fmt: skip


def build_v2_layout(root: Path) -> None:
    bob = root / "users" / "bob"
    write_json(bob / "memory.json", {"version": "2.0", "revision": 3, **SUMMARIES})
    write_v2_fact(bob, "__default__", v2_fact("fact_b1", "Runs Postgres 16"), "bob")
    write_v2_fact(bob, "researcher", v2_fact("fact_b2", "用户在杭州工作", "context"), "bob")
    write_v2_fact(
        bob,
        "researcher",
        v2_fact(
            "fact_b3",
            "Use make dev\nnot npm start",
            "correction",
            sourceError="suggested npm start",
            source={"type": "manual", "threadId": None},
        ),
        "bob",
    )
    write_v2_fact(
        bob, "researcher", v2_fact("fact_b4", "Is a marine biologist", "other",
                                   categoryExtension="identity"), "bob"
    )  # fmt: skip
    # A custom agent's definition without memory is not a memory scope.
    (root / "agents" / "my.agent").mkdir(parents=True)
    (root / "agents" / "my.agent" / "config.yaml").write_text("name: x\n", encoding="utf-8")
    # The previous default bucket (no config.yaml): the user-global memory.
    write_v2_fact(bob, "lead-agent", v2_fact("fact_b5", "Likes green tea"), "bob")


@pytest.fixture(params=["file", "redis"])
def settings(make_settings: Any, request: pytest.FixtureRequest) -> MemqSettings:
    return make_settings(storage=request.param)  # type: ignore[no-any-return]


def test_reads_a_v2_fact_file(tmp_path: Path) -> None:
    path = write_v2_fact(
        tmp_path, "x", v2_fact("f1", "Line one\nline two", "other", categoryExtension="skill"), "u"
    )
    assert fact_from_markdown(path) == {
        "id": "f1",
        "content": "Line one\nline two",
        "category": "skill",
        "confidence": 0.85,
        "createdAt": "2026-08-01T10:00:00.000000Z",
        "source": "th-7",
        "consolidatedFrom": [],
    }


def test_both_layouts_every_user_and_agent_twice(settings: MemqSettings, tmp_path: Path) -> None:
    root = tmp_path / "deer-flow"
    build_old_layout(root)
    build_v2_layout(root)
    store = get_storage(settings)
    first = import_folder(store, root)
    assert (first.users, first.documents, first.facts_added, first.facts_present) == (3, 5, 8, 0)
    assert first.summaries_set == 9  # three sections each for default, alice, bob

    # DeerFlow's "default" user is its anonymous one: memq's user None.
    default = store.load(None, None)
    assert [f.id for f in default.facts] == ["fact_legacy1"]
    assert default.user.work_context.summary == "Backend engineer at Acme"
    assert [f.content for f in store.load(None, "coder").facts] == ["Prefers tabs"]
    assert [f.content for f in store.load("alice", None).facts] == ["Lives in Lisbon"]
    bob = store.load("bob", None)
    assert sorted(f.id for f in bob.facts) == ["fact_b1", "fact_b5"]
    assert bob.history.recent_months.summary == "Worked on DeerFlow"
    researcher = {f.id: f for f in store.load("bob", "researcher").facts}
    assert researcher["fact_b2"].content == "用户在杭州工作"
    assert researcher["fact_b2"].source_thread_id == "th-7"
    assert researcher["fact_b3"].content == "Use make dev\nnot npm start"
    assert researcher["fact_b3"].source == "manual"
    assert researcher["fact_b3"].source_error == "suggested npm start"
    assert researcher["fact_b4"].category == "identity"

    # memq learns something meanwhile; a second run adds nothing and keeps it.
    def learn(document: Any) -> Any:
        document.facts[0].content = "Runs Postgres 17"
        return document

    store.update("bob", None, learn)
    second = import_folder(store, root)
    assert (second.facts_added, second.facts_present, second.summaries_set) == (0, 8, 0)
    assert len(store.load("bob", "researcher").facts) == 3
    assert "Runs Postgres 17" in [f.content for f in store.load("bob", None).facts]


def test_a_bad_file_is_named_and_nothing_is_written(settings: MemqSettings, tmp_path: Path) -> None:
    root = tmp_path / "deer-flow"
    build_v2_layout(root)
    broken = root / "users" / "zed" / "agents" / "x" / "facts" / "00" / "f.md"
    broken.parent.mkdir(parents=True)
    broken.write_text("no front matter", encoding="utf-8")
    store = get_storage(settings)
    with pytest.raises(DeerFlowImportError, match=r"f\.md: not a DeerFlow fact file"):
        import_folder(store, root)
    assert store.list_users() == []
    (tmp_path / "empty").mkdir()
    with pytest.raises(DeerFlowImportError, match="no DeerFlow memory found"):
        import_folder(store, tmp_path / "empty")


def test_cli_import_deerflow_twice(
    make_settings: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    settings = make_settings()
    monkeypatch.setenv("MEMQ_STORAGE_DIR", str(settings.storage_dir))
    monkeypatch.setenv("MEMQ_REDIS_URL", settings.redis_url)
    root = tmp_path / "deer-flow"
    build_old_layout(root)
    build_v2_layout(root)
    assert main(["import", "--deerflow", str(root)]) == 0
    out = capsys.readouterr().out
    assert "3 user(s), 5 memory document(s)" in out and "8 fact(s) added" in out
    assert main(["import", "--deerflow", str(root)]) == 0
    assert "0 fact(s) added, 8 already present" in capsys.readouterr().out
    assert main(["import", "--deerflow", str(tmp_path / "missing")]) == 1
    assert "missing: not a folder" in capsys.readouterr().err
    assert main(["import", "alice"]) == 1
    assert "import needs USER FILE, or --deerflow DIR" in capsys.readouterr().err
