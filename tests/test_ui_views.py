"""The inspector's pure view functions: the fact table's sort and filter, provenance read from
documents with and without the provenance fields, the preview's left-out facts, and the one
filter every stored string goes through."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memq.core.models import Message
from memq.core.settings import MemqSettings
from memq.memory.apply import apply_update
from memq.memory.update import NewFact, UpdateAnswer
from memq.server.ui import views
from memq.server.ui.render import hidden_characters, path_segment, query, stored_text
from prompts.conversation import message_excerpt
from storage.document import Fact, MemoryDocument
from storage.provenance import RunInfo, RunMessage
from storage.sources import Source
from worker.watermark import message_identity

AT = datetime(2026, 1, 2, tzinfo=UTC)
SETTINGS = MemqSettings(llm_provider="rules")


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
        # equal values: by fact id, reversed with the column (one total order to page through)
        ("confidence", True, ["A sails", "c owns a boat", "b likes tea"]),
        ("confidence", False, ["b likes tea", "c owns a boat", "A sails"]),
        ("content", False, ["A sails", "b likes tea", "c owns a boat"]),
        ("category", False, ["A sails", "b likes tea", "c owns a boat"]),
    ],
)
def test_the_fact_table_sorts_by_its_column_then_by_fact_id(
    sort: views.SortKey, descending: bool, expected: list[str]
) -> None:
    ordered = [
        fact(c.content, id=f"f{n}", category=c.category, confidence=c.confidence)
        for n, c in enumerate(FACTS)
    ]
    table = views.fact_table(ordered, sort=sort, descending=descending)
    assert [f.content for f in table.rows] == expected
    assert table.next is None and table.total == 3


def test_the_fact_table_filters_by_category() -> None:
    shown = views.fact_table(FACTS, category="preference").rows
    assert sorted(f.content for f in shown) == ["b likes tea", "c owns a boat"]
    assert views.fact_table(FACTS, category="goal").rows == []
    assert views.sort_key("'; drop") == "confidence"


@given(
    st.lists(st.integers(0, 5), min_size=0, max_size=60),
    st.lists(st.integers(0, 200), max_size=10),
    st.lists(st.integers(0, 59), max_size=10),
    st.sampled_from(views.SORT_KEYS),
    st.booleans(),
)
def test_walking_the_pages_while_facts_come_and_go_repeats_and_skips_nothing(
    confidences: list[int],
    added: list[int],
    removed: list[int],
    sort: views.SortKey,
    descending: bool,
) -> None:
    facts = [
        fact(f"fact {n}", id=f"f{n:03d}", confidence=c / 5, category=("goal", "context")[n % 2])
        for n, c in enumerate(confidences)
    ]
    survivors = {f.id for f in facts} - {f"f{n:03d}" for n in removed}
    seen: list[str] = []
    cursor = None
    for step in range(100):
        page = views.fact_table(facts, sort=sort, descending=descending, after=cursor, limit=7)
        seen += [f.id for f in page.rows]
        if page.next is None:
            break
        cursor = page.next
        # between pages: a fact added, one removed (what an extraction or an operator does)
        if step < len(added):
            facts.append(fact(f"new {step}", id=f"n{added[step]:03d}-{step}", confidence=0.5))
        if step < len(removed):
            facts = [f for f in facts if f.id != f"f{removed[step]:03d}"]
    assert len(seen) == len(set(seen))  # nothing shown twice
    assert survivors <= set(seen)  # every fact there all along was shown


def test_a_page_link_that_is_not_ours_is_one_clear_error() -> None:
    with pytest.raises(ValueError, match="page link is not valid"):
        views.fact_table(FACTS, after="not-a-cursor!")
    other = views.fact_table(FACTS, sort="content", limit=1).next
    assert other is not None
    with pytest.raises(ValueError, match="page link is not valid"):
        views.fact_table(FACTS, sort="confidence", after=other)


def test_a_fact_from_before_sources_shows_its_source_thread() -> None:
    old = Fact.model_validate({"content": "x", "source_thread_id": "chat-7"})
    assert views.sources(old) == [Source(thread_id="chat-7", attribution="run")]
    assert views.sources(fact("y", source="manual")) == []
    assert views.confirmations(old) == 0


def _learnt(
    doc: MemoryDocument, thread: str, said: str, *facts: NewFact, remove: tuple[str, ...] = ()
) -> MemoryDocument:
    """What an extraction run writes: the worker's own update rules on a labelled run."""
    message = Message("user", said)
    run = RunInfo(
        thread,
        f"run-{thread}",
        AT,
        (RunMessage("m1", message_identity(message), "user", message_excerpt(message)),),
        "gpt-x",
        "v3",
    )
    answer = UpdateAnswer(new_facts=facts, facts_to_remove=remove)
    return apply_update(doc, answer, settings=SETTINGS, now=AT, thread_id=thread, run=run).document


def test_recorded_sources_confirmations_and_superseded_facts_are_read_from_real_runs() -> None:
    tea = NewFact(content="drinks tea", confidence=0.9, cites=("m1",))
    berlin = NewFact(content="lives in Berlin", confidence=0.9, cites=("m1",))
    doc = _learnt(MemoryDocument(), "chat-1", "I drink tea and live in Berlin", tea, berlin)
    doc = _learnt(doc, "chat-2", "Tea, as always", NewFact(content="drinks tea", confidence=0.9))
    (learnt,) = [f for f in doc.facts if f.content == "drinks tea"]
    first, again = views.sources(learnt)
    assert (first.thread_id, first.attribution, first.excerpts) == (
        "chat-1",
        "message",
        ("I drink tea and live in Berlin",),
    )
    assert (first.run_id, first.at, first.model, first.prompt_version) == (
        "run-chat-1",
        AT,
        "gpt-x",
        "v3",
    )
    assert (again.thread_id, again.attribution, again.excerpts) == ("chat-2", "run", ())
    assert views.confirmations(learnt) == 1

    retired = next(f for f in doc.facts if f.content == "lives in Berlin")
    oslo = NewFact(content="now in Oslo", confidence=0.9, cites=("m1",))
    doc = _learnt(doc, "chat-3", "I moved to Oslo", oslo, remove=(retired.id,))
    replacement = next(f for f in doc.facts if f.content == "now in Oslo")
    entries = views.superseded(doc)
    assert [(e.fact.content, e.kind, e.thread_id) for e in entries] == [
        ("lives in Berlin", "contradicted", "chat-3")
    ]
    assert views.superseded_by(entries, replacement.id) == entries
    assert views.superseded_fact(entries, retired.id) == entries[0]
    assert views.sources(entries[0].fact)[0].excerpts == ("I drink tea and live in Berlin",)
    assert views.superseded(MemoryDocument()) == []


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


@pytest.mark.parametrize(
    ("chosen", "accept", "expected"),
    [
        (None, "zh-CN,zh;q=0.9,en;q=0.8", "zh-Hans"),
        (None, "en-US,en;q=0.9,zh;q=0.8", "en"),
        (None, "fr-FR, zh-Hans;q=0.5", "zh-Hans"),  # the best one memq has
        (None, "zh-TW", "en"),  # Traditional Chinese is not Simplified
        (None, "zh;q=0, en;q=0.1", "en"),
        (None, "", "en"),
        ("zh-Hans", "en", "zh-Hans"),  # the switch wins over the browser
        ("klingon", "zh", "zh-Hans"),
    ],
)
def test_the_language_is_the_switch_else_the_browsers_best_else_english(
    chosen: str | None, accept: str, expected: str
) -> None:
    from memq.server.ui.i18n import choose

    assert choose(chosen, accept) == expected


def test_the_chinese_catalogue_translates_every_template_string() -> None:
    from memq.server.ui.i18n import translations

    zh = translations("zh-Hans")
    for english in ("Users", "Forget and don't learn again", *views.NOTICES.values()):
        assert zh.gettext(english) != english, english
    purged = ("%(num)s dead letter purged", "%(num)s dead letters purged")
    assert zh.ngettext(*purged, 2) % {"num": 2} == "已清除 2 条死信"


def test_the_queue_shows_its_depths_and_only_the_totals_that_are_not_zero() -> None:
    from memq.server.ui.routes_queue import triage_rows

    rows: list[tuple[str, object]] = [
        ("due", 0),
        ("in flight", 0),
        ("dead letters now", 3),
        ("oldest deadline lag", "0.0 s"),
        ("last tick", "0.2 s ago"),
        ("extractions: updated", 12),
        ("batch: submitted", 0),
        ("LLM cost", "$0.000000"),
    ]
    assert [label for label, _ in triage_rows(rows)] == [
        "due",
        "in flight",
        "dead letters now",
        "oldest deadline lag",
        "last tick",
        "extractions: updated",
    ]
