"""One fact-length limit (``MEMQ_FACT_MAX_CHARS``) at every door a fact comes in by: extraction
(cut), the management API (refused, naming the field) and import (cut and counted), memq's JSON
and DeerFlow's formats alike."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest

from memq.cli import main
from memq.core.errors import InvalidMemoryData
from memq.core.identity import DEFAULT_USER_ID
from memq.core.settings import MemqSettings
from memq.integrations.deerflow_import import import_folder
from memq.memory.apply import apply_update
from memq.memory.update import NewFact, UpdateAnswer
from storage import get_storage
from storage.cap import cap_fact_length
from storage.document import Fact, MemoryDocument
from storage.management import MemoryManager

NOW = datetime(2026, 7, 15, 12, 0, tzinfo=UTC)
LIMIT = 100


def test_the_limit_is_a_setting_with_a_sensible_default(monkeypatch: Any) -> None:
    assert MemqSettings().fact_max_chars == 1000
    monkeypatch.setenv("MEMQ_FACT_MAX_CHARS", "250")
    from memq.core.settings import load_settings

    assert load_settings().fact_max_chars == 250


def test_cap_cuts_content_and_mistake_and_names_what_it_cut() -> None:
    fact = Fact(content="a" * 150, source_error="b" * 150, category="correction")
    capped, cut = cap_fact_length(fact, LIMIT)
    assert cut == ("content", "source_error")
    assert len(capped.content) == LIMIT and capped.content.endswith("…")
    assert len(capped.source_error or "") == LIMIT
    assert capped.id == fact.id and fact.content == "a" * 150  # a copy: the input is untouched
    short = Fact(content="x" * LIMIT)
    assert cap_fact_length(short, LIMIT) == (short, ())


def test_extraction_cuts_an_over_long_fact_and_still_deduplicates_it() -> None:
    settings = MemqSettings(llm_provider="rules", fact_max_chars=LIMIT)
    answer = UpdateAnswer(new_facts=[NewFact(content="z" * 5000, confidence=0.9)])
    first = apply_update(MemoryDocument(), answer, settings=settings, now=NOW)
    (fact,) = first.document.facts
    assert len(fact.content) == LIMIT
    assert any("cut to 100 characters" in c.reason for c in first.changes)
    again = apply_update(first.document, answer, settings=settings, now=NOW)
    assert len(again.document.facts) == 1  # the same long fact proposed again is a duplicate


@pytest.fixture
def manager(make_settings: Any) -> MemoryManager:
    return MemoryManager(get_storage(make_settings()), fact_max_chars=LIMIT)


def test_management_refuses_an_over_long_fact_naming_the_field(manager: MemoryManager) -> None:
    with pytest.raises(
        InvalidMemoryData, match=r"content is 101 characters, over the limit of 100"
    ):
        manager.add_fact("alice", "x" * 101)
    with pytest.raises(InvalidMemoryData, match=r"source_error is 200 characters"):
        manager.add_fact("alice", "ok", category="correction", source_error="e" * 200)
    fact = manager.add_fact("alice", "x" * LIMIT)  # exactly at the limit is fine
    with pytest.raises(InvalidMemoryData, match=r"content is 101 characters.*MEMQ_FACT_MAX_CHARS"):
        manager.edit_fact("alice", fact.id, content="y" * 101)
    assert [f.content for f in manager.list_facts("alice")] == ["x" * LIMIT]  # nothing changed


def test_import_of_memq_and_deerflow_json_cuts_and_counts(manager: MemoryManager) -> None:
    memq_json = {"facts": [{"content": "m" * 500}, {"content": "short"}]}
    document, cut = manager.import_document_counted("alice", json.dumps(memq_json))
    assert cut == 1 and sorted(len(f.content) for f in document.facts) == [5, LIMIT]
    deerflow_json = {
        "version": "1.0",
        "facts": [{"id": "f1", "content": "d" * 300, "category": "context", "confidence": 0.9}],
    }
    document = manager.import_document("bob", deerflow_json)
    assert [len(f.content) for f in document.facts] == [LIMIT]
    (change, *_) = manager.history("bob")
    assert "1 cut to 100 characters" in change.reason


def test_deerflow_folder_import_cuts_and_reports(make_settings: Any, tmp_path: Path) -> None:
    root = tmp_path / "deer-flow"
    root.mkdir()
    facts = [
        {"id": "f_long", "content": "L" * 3000, "category": "context", "confidence": 0.9},
        {"id": "f_ok", "content": "Uses uv", "category": "preference", "confidence": 0.9},
    ]
    (root / "memory.json").write_text(json.dumps({"version": "1.0", "facts": facts}), "utf-8")
    store = get_storage(make_settings())
    report = import_folder(store, root, fact_max_chars=LIMIT)
    assert report.facts_cut == 1 and "1 over-long fact(s) cut" in report.describe()
    stored = {f.id: f.content for f in store.load(DEFAULT_USER_ID, None).facts}
    assert len(stored["f_long"]) == LIMIT and stored["f_ok"] == "Uses uv"


def test_cli_import_says_how_many_facts_were_cut(
    make_settings: Any, tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: Any
) -> None:
    settings = make_settings()
    monkeypatch.setenv("MEMQ_STORAGE_DIR", str(settings.storage_dir))
    monkeypatch.setenv("MEMQ_REDIS_URL", settings.redis_url)
    monkeypatch.setenv("MEMQ_FACT_MAX_CHARS", str(LIMIT))
    path = tmp_path / "memory.json"
    path.write_text(json.dumps({"facts": [{"content": "q" * 400}]}), "utf-8")
    assert main(["import", "carol", str(path)]) == 0
    assert "1 over-long fact cut to 100 characters" in capsys.readouterr().out
    assert main(["facts", "add", "carol", "w" * 101]) == 1
    assert "content is 101 characters" in capsys.readouterr().err
