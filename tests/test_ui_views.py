"""The inspector's pure view functions: the fact table's sort and filter, provenance read from
documents with and without the provenance fields, the preview's left-out facts, and the one
filter every stored string goes through."""

from __future__ import annotations

from datetime import UTC, datetime
from types import SimpleNamespace

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memq.server.ui import views
from memq.server.ui.render import hidden_characters, path_segment, query, stored_text
from prompts.injection import format_memory_for_injection
from storage.document import Fact, MemoryDocument


def fact(content: str, **fields: object) -> Fact:
    return Fact(content=content, **fields)  # type: ignore[arg-type]


FACTS = [
    fact("b likes tea", category="preference", confidence=0.6),
    fact("A sails", category="knowledge", confidence=0.9),
    fact("c owns a boat", category="preference", confidence=0.6),
]


@pytest.mark.parametrize(
    ("sort", "descending", "expected"),
    [
        ("confidence", True, ["A sails", "b likes tea", "c owns a boat"]),
        ("confidence", False, ["b likes tea", "c owns a boat", "A sails"]),
        ("content", False, ["A sails", "b likes tea", "c owns a boat"]),
        ("category", False, ["A sails", "b likes tea", "c owns a boat"]),
    ],
)
def test_the_fact_table_sorts_keeping_document_order_among_equals(
    sort: views.SortKey, descending: bool, expected: list[str]
) -> None:
    table = views.fact_table(FACTS, sort=sort, descending=descending)
    assert [f.content for f in table] == expected


def test_the_fact_table_filters_by_category_and_case_folded_text() -> None:
    assert [f.content for f in views.fact_table(FACTS, category="preference", text="BOAT")] == [
        "c owns a boat"
    ]
    assert views.fact_table(FACTS, text="nothing") == []
    assert views.sort_key("'; drop") == "confidence"


def test_a_fact_from_before_sources_shows_its_source_thread() -> None:
    old = fact("x", source_thread_id="chat-7")
    assert views.sources(old) == [views.SourceView(thread_id="chat-7")]
    assert views.sources(fact("y", source="manual")) == []
    assert views.confirmations(old) == 0


def test_recorded_sources_confirmations_and_superseded_facts_are_read_when_present() -> None:
    at = datetime(2026, 1, 2, tzinfo=UTC)
    source = SimpleNamespace(
        thread_id="chat-9",
        messages=("ab12", "cd34"),
        roles=("user", "assistant"),
        attribution="message",
        run_id="run-1",
        at=at,
        model="gpt-x",
        prompt_version="v3",
    )
    learnt = SimpleNamespace(sources=[source, SimpleNamespace()], confirmations=2)
    shown = views.sources(learnt)
    assert shown[0] == views.SourceView(
        "chat-9", ("ab12", "cd34"), ("user", "assistant"), "message", "run-1", at, "gpt-x", "v3"
    )
    assert shown[1] == views.SourceView(thread_id=None, attribution="run")
    assert views.confirmations(learnt) == 2
    assert views.confirmations(SimpleNamespace(confirmations=True)) == 0

    replacement, retired = fact("now in Oslo"), fact("lives in Berlin")
    document = SimpleNamespace(
        superseded=[
            SimpleNamespace(
                fact=retired,
                kind="contradicted",
                superseded_at=at,
                replaced_by=[replacement.id],
                reason="moved",
                thread_id="chat-9",
            ),
            SimpleNamespace(fact="not a fact"),
        ]
    )
    entries = views.superseded(document)  # type: ignore[arg-type]
    assert [(e.fact.content, e.kind, e.reason) for e in entries] == [
        ("lives in Berlin", "contradicted", "moved")
    ]
    assert views.superseded_by(entries, replacement.id) == entries
    assert views.superseded_fact(entries, retired.id) == entries[0]
    assert views.superseded(MemoryDocument()) == []


def test_left_out_is_every_fact_whose_line_is_not_in_the_block() -> None:
    document = MemoryDocument(
        facts=[fact(f"The user owns item-{n} " + "x " * 30) for n in range(20)]
    )
    block = format_memory_for_injection(document, 200, token_counting=False)
    left = views.left_out(document.facts, block)
    assert left and len(left) < 20
    assert all(f.content not in block for f in left)
    assert all(f.content in block for f in document.facts if f not in left)
    assert views.left_out(document.facts, "") == document.facts


@given(st.text(max_size=200))
def test_stored_text_is_escaped_and_isolated_whatever_it_holds(text: str) -> None:
    html = str(stored_text(text, "fact"))
    assert html.startswith('<span class="ut fact">')
    body = html.split("</span>")[0][len('<span class="ut fact">') :]
    assert "<" not in body and ">" not in body and '"' not in body
    if text.isprintable():
        assert "hidden-chars" not in html


def test_hidden_characters_are_named_and_ids_are_one_path_segment() -> None:
    assert hidden_characters("a\u200bb\u202ec\x07\n\t\u2028") == [
        "U+0007",
        "U+200B",
        "U+2028",
        "U+202E",
    ]
    assert hidden_characters("plain text, 中文") == []
    assert path_segment("auth0|abc/../x") == "auth0%7Cabc%2F..%2Fx"
    assert query({"agent": None, "tab": "", "q": "a&b=c"}) == "?q=a%26b%3Dc"


def test_a_missing_browser_skips_with_its_reason_but_fails_under_ci(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from tests.support import inspector

    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="no chromium"):
        inspector._missing("no chromium and chromedriver on this machine")
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match="CI must run the browser tests"):
        inspector._missing("no chromium and chromedriver on this machine")
