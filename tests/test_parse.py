"""Reading the model's answer: wrapped JSON, decoys, streamed chunks, per-field normalisation and
the fail-closed rule."""

from __future__ import annotations

import json
from typing import Any

import pytest

from memq.core.errors import ResponseParseError
from prompts.answer import parse_update_response, response_text

FACT = {"content": "Uses Rust daily", "category": "knowledge", "confidence": 0.9}


def answer(**fields: Any) -> dict[str, Any]:
    data: dict[str, Any] = {"user": {}, "history": {}, "newFacts": [FACT]}
    data.update(fields)
    return data


VALID = json.dumps(answer())


@pytest.mark.parametrize(
    "wrapped",
    [
        VALID,
        f"<think>Let me see {{not json}} what to do</think>\n{VALID}",
        f"<think>unclosed reasoning {{ \n{VALID}",
        f"```json\n{VALID}\n```",
        f"Here is the update:\n{VALID}\nHope that helps! {{}}",
        '{"user": "alice"} and then ' + VALID,  # a decoy object first
        '{"user": {}, "history": {}} ' + VALID,  # a decoy missing newFacts
        [VALID[:10], VALID[10:25], VALID[25:]],  # streamed string chunks
        [{"type": "text", "text": VALID}, {"type": "image_url", "image_url": {}}],
    ],
)
def test_wrapped_answers_are_found(wrapped: Any) -> None:
    (fact,) = parse_update_response(wrapped).new_facts
    assert fact.content == "Uses Rust daily" and fact.category == "knowledge"


def test_an_answer_after_a_brace_heavy_preamble_is_found() -> None:
    """Thousands of braces before the JSON (reasoning about code, templates) are not a reason to
    give up: the search is bounded by the work done, not by the number of braces."""
    draft = json.dumps(answer(newFacts=[{**FACT, "content": "a draft"}]))
    thinking = "<think>" + "{x} " * 3000 + draft + "</think>\n"
    (fact,) = parse_update_response(thinking + VALID).new_facts
    assert fact.content == "Uses Rust daily"  # the draft inside the reasoning is skipped
    prose = "Consider the set {a, b} and the map {k: v}. " * 500
    (fact,) = parse_update_response(prose + VALID).new_facts
    assert fact.content == "Uses Rust daily"


def test_a_draft_inside_the_reasoning_is_the_answer_only_when_there_is_no_other() -> None:
    (fact,) = parse_update_response(f"<think>{VALID}</think> Done.").new_facts
    assert fact.content == "Uses Rust daily"


@pytest.mark.parametrize(
    "garbage",
    [
        "",
        None,
        "I cannot help with that.",
        '{"user": {}, "history": {}, "newFacts": [',  # truncated: no repair
        '{"user": "alice", "newFacts": []}',
        "```json\n{'user': {}, 'history': {}, 'newFacts': []}\n```",  # Python repr is not JSON
    ],
)
def test_answers_without_an_update_object_are_parse_errors(garbage: Any) -> None:
    with pytest.raises(ResponseParseError):
        parse_update_response(garbage)


def test_list_content_joins_chunks_without_separator_and_blocks_with_newlines() -> None:
    assert response_text(["ab", "cd", {"text": "ef"}, {"kind": "x"}, "gh"]) == "abcd\nef\ngh"


def test_section_updates_accept_real_booleans_and_honest_strings() -> None:
    data = answer(
        user={
            "workContext": {"summary": "  Engineer at Acme ", "shouldUpdate": True},
            "personalContext": {"summary": "Speaks French", "shouldUpdate": "false"},
            "topOfMind": {"summary": "Shipping v2", "shouldUpdate": "true"},
        },
        history={"recentMonths": "not an object", "earlierContext": {"summary": 3}},
    )
    sections = parse_update_response(json.dumps(data)).sections
    assert sections["work_context"].summary == "Engineer at Acme"
    assert sections["work_context"].should_update is True
    assert sections["personal_context"].should_update is False  # "false" is false (§10.17)
    assert sections["top_of_mind"].should_update is True
    assert "recent_months" not in sections and "earlier_context" not in sections


@pytest.mark.parametrize(
    ("raw", "expected"),
    [
        ({"content": "a", "confidence": 1.5}, 1.0),  # clamped, unlike DeerFlow
        ({"content": "a", "confidence": -2}, 0.0),
        ({"content": "a", "confidence": " 0.8 "}, 0.8),
        ({"content": "a"}, 0.5),  # absent: inferred
        ({"content": "a", "confidence": None}, None),  # explicit null: dropped
        ({"content": "a", "confidence": True}, None),
        ({"content": "a", "confidence": "high"}, None),
        ({"content": "a", "confidence": "NaN"}, None),
        ({"content": "a", "confidence": [0.9]}, None),
        ({"content": "   ", "confidence": 0.9}, None),
        ({"content": 42, "confidence": 0.9}, None),
        ("just a string", None),
    ],
)
def test_new_fact_confidence_and_content_rules(raw: Any, expected: float | None) -> None:
    parsed = parse_update_response(json.dumps(answer(newFacts=[raw])))
    if expected is None:
        assert parsed.new_facts == () and parsed.dropped_facts == 1
    else:
        assert parsed.new_facts[0].confidence == expected


@pytest.mark.parametrize(
    ("category", "expected"),
    [
        ("preference", "preference"),
        (" Preferences ", "preference"),
        ("GOAL", "goal"),
        ("favourite things", "context"),
        (None, "context"),
        ("", "context"),
        (7, "context"),
    ],
)
def test_categories_are_normalised_to_the_six_names(category: Any, expected: str) -> None:
    raw = {"content": "x", "confidence": 0.9, "category": category}
    assert (
        parse_update_response(json.dumps(answer(newFacts=[raw]))).new_facts[0].category == expected
    )


def test_source_error_is_kept_only_when_it_says_something() -> None:
    facts = [
        {"content": "a", "confidence": 0.9, "sourceError": "  used npm  "},
        {"content": "b", "confidence": 0.9, "sourceError": "   "},
        {"content": "c", "confidence": 0.9, "sourceError": 3},
    ]
    parsed = parse_update_response(json.dumps(answer(newFacts=facts)))
    assert [f.source_error for f in parsed.new_facts] == ["used npm", None, None]


def test_fail_closed_when_removals_come_with_a_malformed_fact() -> None:
    data = answer(newFacts=[FACT, {"content": "", "confidence": 0.9}], factsToRemove=["fact_1"])
    with pytest.raises(ResponseParseError, match="malformed"):
        parse_update_response(json.dumps(data))
    with pytest.raises(ResponseParseError):
        parse_update_response(json.dumps(answer(newFacts="oops", factsToRemove=["fact_1"])))


def test_malformed_fact_without_removals_only_drops_that_fact() -> None:
    data = answer(newFacts=[FACT, {"content": "", "confidence": 0.9}])
    parsed = parse_update_response(json.dumps(data))
    assert len(parsed.new_facts) == 1 and parsed.dropped_facts == 1


def test_removals_are_optional_and_only_string_ids_count() -> None:
    assert parse_update_response(VALID).facts_to_remove == ()
    data = answer(factsToRemove=["fact_a", 3, None, " ", {"id": "fact_b"}, "fact_a"])
    assert parse_update_response(json.dumps(data)).facts_to_remove == ("fact_a", "fact_b")
    assert parse_update_response(json.dumps(answer(factsToRemove="fact_a"))).facts_to_remove == ()


def test_stale_removals_need_an_id() -> None:
    data = answer(
        staleFactsToRemove=[{"id": "f1", "reason": "moved on"}, {"id": "f2"}, {"reason": "x"}, "f3"]
    )
    stale = parse_update_response(json.dumps(data)).stale_facts_to_remove
    assert [(s.id, s.reason) for s in stale] == [("f1", "moved on"), ("f2", "")]


def test_consolidations_need_two_distinct_sources_and_content() -> None:
    data = answer(
        factsToConsolidate=[
            {
                "sourceIds": ["a", "b", "a", 3],
                "consolidated": {"content": " merged ", "confidence": 2},
            },
            {"sourceIds": ["a", "a"], "consolidated": {"content": "one source"}},
            {"sourceIds": ["a", "b"], "consolidated": {"content": "  "}},
            {"sourceIds": "a,b", "consolidated": {"content": "x"}},
            {"sourceIds": ["c", "d"], "consolidated": {"content": "no conf", "category": "Goals"}},
        ]
    )
    first, second = parse_update_response(json.dumps(data)).facts_to_consolidate
    assert first.source_ids == ("a", "b") and first.content == "merged" and first.confidence == 1.0
    assert second.confidence is None and second.category == "goal"


def test_an_answer_without_its_lists_means_none_and_says_what_it_left_out() -> None:
    """The 1.5B model's dead letter: summaries only, no newFacts, no factsToRemove."""
    summaries = {"workContext": {"summary": "", "shouldUpdate": False}}
    parsed = parse_update_response(json.dumps({"user": summaries, "history": {}}))
    assert parsed.is_noop() and parsed.dropped_facts == 0
    assert parsed.missing_fields == ("newFacts", "factsToRemove")
    only_facts = parse_update_response(f"Sure: {json.dumps({'newFacts': [FACT]})}")
    assert [f.content for f in only_facts.new_facts] == ["Uses Rust daily"]
    assert only_facts.missing_fields == ("user", "history", "factsToRemove")
    assert parse_update_response(VALID).missing_fields == ("factsToRemove",)
    removal = parse_update_response(
        json.dumps({"user": {}, "history": {}, "factsToRemove": ["f1"]})
    )
    assert removal.facts_to_remove == ("f1",) and removal.dropped_facts == 0


def test_a_complete_answer_wins_over_a_partial_one_before_it() -> None:
    text = '{"newFacts": []} then ' + VALID
    assert [f.content for f in parse_update_response(text).new_facts] == ["Uses Rust daily"]


@pytest.mark.parametrize(
    "stray",
    [
        '{"user": "alice"}',  # a key of an answer, but not of its kind
        '{"answer": {"facts": ["likes tea"]}}',  # no key of an answer at all
        '{"newFacts": "none", "history": {}}',
    ],
)
def test_objects_that_are_no_answer_still_fail(stray: str) -> None:
    with pytest.raises(ResponseParseError, match="no JSON object"):
        parse_update_response(f"Here you go: {stray}")
