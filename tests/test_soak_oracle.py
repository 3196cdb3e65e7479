"""The soak's oracle catches each planted fault: a lost, duplicated, misplaced or invalid item,
and a forgotten user's trace; and it passes a clean run."""

from __future__ import annotations

import json
from dataclasses import replace

from bench.soak.oracle import (
    DeadLetter,
    LossWindow,
    OracleInput,
    StoredFact,
    Turn,
    judge,
    percentile,
)
from storage.document import Fact, MemoryDocument

A, B, C, D = (f"M-{n:012x}" for n in (10, 11, 12, 13))


def fact(marker: str, run: str = "r1", created_ms: int = 2_000) -> StoredFact:
    return StoredFact(content=f"Code word {marker} noted by {run}", created_ms=created_ms)


def raw(*markers: str) -> str:
    doc = MemoryDocument(facts=[Fact(content=f"Code word {m}", confidence=0.9) for m in markers])
    return doc.model_dump_json()


def clean() -> OracleInput:
    return OracleInput(
        turns=[
            Turn(A, "u1", "agent", "t1", produced_ms=1_000, acked=True, last_ack_ms=1_000),
            Turn(B, "u1", "agent", "t1", produced_ms=1_500, acked=True, last_ack_ms=1_500),
            Turn(C, "u2", None, "t2", produced_ms=1_000, acked=False, spooled=True),
            Turn(D, "u3", "agent", "t3", produced_ms=1_000, acked=True, last_ack_ms=1_000),
        ],
        documents={("u1", "agent"): [fact(A), fact(B, created_ms=3_500)], ("u2", None): [fact(C)]},
        raw_documents={("u1", "agent"): raw(A, B), ("u2", None): raw(C)},
        dead_letters=[],
        forgotten=frozenset({"u3"}),
        redis_dump={"memq:{memq:0}:due": "", "memq:mem:{u1:agent}:doc": raw(A, B)},
    )


def test_a_clean_run_passes_with_its_counts_and_lags() -> None:
    verdict = judge(clean())
    assert verdict.failures == []
    assert (verdict.produced, verdict.acknowledged, verdict.spooled_only) == (4, 3, 1)
    assert (verdict.extracted, verdict.forgotten_turns, verdict.dead_lettered) == (3, 1, 0)
    assert sorted(verdict.lags_ms) == [1_000, 1_000, 2_000]


def test_a_lost_turn_fails() -> None:
    data = clean()
    data = replace(data, documents={**data.documents, ("u1", "agent"): [fact(A)]})
    verdict = judge(data)
    assert [t.marker for t in verdict.lost] == [B]
    assert not verdict.passed
    assert "1 lost turn(s)" in verdict.failures[0]


def test_a_dead_letter_with_a_reason_accounts_for_the_turn_but_not_without_one() -> None:
    data = replace(clean(), documents={("u1", "agent"): [fact(A)], ("u2", None): [fact(C)]})
    letter = DeadLetter("ctx", "u1", "agent", "PermanentLLMError: 400", frozenset({B}))
    verdict = judge(replace(data, dead_letters=[letter]))
    assert verdict.passed and verdict.dead_lettered == 1
    verdict = judge(replace(data, dead_letters=[replace(letter, reason="")]))
    assert [t.marker for t in verdict.lost] == [B]
    # A dead letter of another agent does not excuse it either.
    verdict = judge(replace(data, dead_letters=[replace(letter, agent="other")]))
    assert [t.marker for t in verdict.lost] == [B]


def test_a_turn_acknowledged_only_inside_a_loss_window_is_counted_apart() -> None:
    data = replace(clean(), documents={("u1", "agent"): [fact(A)], ("u2", None): [fact(C)]})
    verdict = judge(replace(data, loss_windows=[LossWindow(1_200, 2_000)]))
    assert verdict.passed
    assert [t.marker for t in verdict.lost_in_window] == [B]
    # A spooled turn is the producer's to deliver: no window excuses it.
    data = replace(data, documents={("u1", "agent"): [fact(A), fact(B)]})
    verdict = judge(replace(data, loss_windows=[LossWindow(0, 5_000)]))
    assert [t.marker for t in verdict.lost] == [C]


def test_two_runs_that_both_wrote_show_as_a_duplicated_marker() -> None:
    data = clean()
    docs = {**data.documents, ("u1", "agent"): [fact(A), fact(B), fact(A, run="r2")]}
    verdict = judge(replace(data, documents=docs))
    assert verdict.duplicated == {A: 2}
    assert not verdict.passed


def test_a_marker_in_another_users_memory_or_of_no_turn_fails() -> None:
    data = clean()
    stray = "M-ffffffffffff"
    docs = {**data.documents, ("u2", None): [fact(C), fact(A), fact(stray)]}
    verdict = judge(replace(data, documents=docs))
    assert verdict.misplaced == [(A, ("u2", None))]
    assert verdict.unknown_markers == [(stray, ("u2", None))]


def test_an_invalid_stored_document_fails() -> None:
    data = clean()
    bad = json.loads(raw(A, B))
    bad["facts"][0]["confidence"] = 7
    verdict = judge(
        replace(data, raw_documents={**data.raw_documents, ("u1", "agent"): json.dumps(bad)})
    )
    assert [key for key, _ in verdict.invalid_documents] == [("u1", "agent")]
    verdict = judge(replace(data, raw_documents={("u2", None): "{not json"}))
    assert len(verdict.invalid_documents) == 1


def test_a_forgotten_users_document_key_or_text_left_in_redis_fails() -> None:
    data = clean()
    verdict = judge(replace(data, documents={**data.documents, ("u3", "agent"): [fact(D)]}))
    assert any("document ('u3', 'agent')" in leak for leak in verdict.forgotten_leaks)
    verdict = judge(replace(data, redis_dump={**data.redis_dump, "memq:{memq:0}:ctx:u3x": ""}))
    assert "key name" in verdict.forgotten_leaks[0]
    verdict = judge(replace(data, redis_dump={"celery": json.dumps({"args": [f"hi {D}"]})}))
    assert D in verdict.forgotten_leaks[0]
    assert not verdict.passed


def test_a_forgotten_users_id_in_the_brokers_bookkeeping_is_tolerated_but_not_their_text() -> None:
    """A killed worker's unacked task message carries the context id until the visibility
    timeout: ids, never conversation text."""
    data = replace(clean(), broker_keys=frozenset({"unacked"}))
    task = json.dumps({"args": ["t-1:u3:agent", "17", 1]})
    assert judge(replace(data, redis_dump={"unacked": task})).forgotten_leaks == []
    leaked = judge(replace(data, redis_dump={"unacked": json.dumps({"args": [f"hi {D}"]})}))
    assert D in leaked.forgotten_leaks[0]


def test_percentile_is_nearest_rank() -> None:
    assert percentile([], 50) is None
    assert percentile([5], 99) == 5
    assert percentile(list(range(1, 101)), 50) == 50
    assert percentile(list(range(1, 101)), 99) == 99
    assert percentile(list(range(1, 101)), 100) == 100
