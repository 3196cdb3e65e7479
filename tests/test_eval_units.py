"""`memq eval`'s pure parts, without Redis: the data-set readers (the real formats, and hostile
files), the hand-offs a conversation becomes, verdicts, scores, the estimate's chunk rule, the
checkpoint and the report — and what the command says before it spends anything."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest

from memq.cli import main
from memq.core.identity import validate_user_id
from memq.core.models import Message
from memq.core.settings import MemqSettings
from memq.evaluation.checkpoint import Checkpoint, CheckpointMismatch
from memq.evaluation.dataset import (
    DatasetError,
    hand_off_points,
    messages_for,
    user_id_for,
)
from memq.evaluation.estimate import estimate, extraction_calls
from memq.evaluation.evaluate import load_evalset
from memq.evaluation.locomo import NOT_MENTIONED, read_locomo
from memq.evaluation.longmemeval import read_longmemeval
from memq.evaluation.prompts import read_verdict
from memq.evaluation.report import (
    Models,
    PriceTable,
    build_result,
    estimate_json,
    markdown,
    svg_chart,
)
from memq.evaluation.scoring import (
    FactRecord,
    Graded,
    Prices,
    Usage,
    accuracy,
    cost,
    extraction_score,
)
from prompts.tokens import estimate_tokens
from worker.pipeline import chunk_budget
from worker.watermark import split_at_watermark

DATA = Path(__file__).parent / "data" / "eval"
LOCOMO = json.loads((DATA / "locomo_small.json").read_text())
LONGMEMEVAL = json.loads((DATA / "longmemeval_small.json").read_text())


def test_locomo_categories_are_numbered_as_the_data_set_numbers_them() -> None:
    evalset = read_locomo(LOCOMO)
    by_question = {q.question: q for q in evalset.questions}
    assert by_question["Which instrument does Ben play in an orchestra?"].category == "multi-hop"
    assert by_question["When did Ann move to Lisbon?"].category == "temporal"
    assert by_question["Would Ben enjoy a classical music concert?"].category == "open-domain"
    assert by_question["What is the name of Ann's cat?"].category == "single-hop"
    adversarial = by_question["What is the name of Ben's cat?"]
    # Category 5 has an adversarial_answer (the trap), never the expected one: not mentioned.
    assert (adversarial.category, adversarial.abstention) == ("adversarial", True)
    assert adversarial.answer == NOT_MENTIONED
    conv = evalset.conversations[0]
    assert conv.subjects == ("Ann", "Ben") and [s.id for s in conv.sessions] == [
        "session_1",
        "session_2",
    ]
    bike = evalset.conversations[1].sessions[0].turns[1]
    assert bike.id == "D1:2" and bike.text.endswith("[shares a photo: a red bicycle]")
    ben = [o for o in evalset.observations if o.subject == "Ben"]
    assert [(o.session_id, o.evidence) for o in ben] == [
        ("session_1", ("D1:2",)),
        ("session_1", ("D1:4",)),
        ("session_2", ("D2:2",)),
    ]


def test_locomo_sessions_go_in_numeric_order_and_evidence_lists_are_split() -> None:
    sample = copy.deepcopy(LOCOMO[0])
    conversation = sample["conversation"]
    conversation["session_10"] = conversation.pop("session_2")
    conversation["session_10_date_time"] = conversation.pop("session_2_date_time")
    conversation["session_3"] = [{"speaker": "Ann", "dia_id": "D3:1", "text": "Hello."}]
    sample["observation"]["session_3_observation"] = {"Ann": [["Ann says hello.", "D3:1; D1:1"]]}
    evalset = read_locomo([sample])
    assert [s.id for s in evalset.conversations[0].sessions] == [
        "session_1",
        "session_3",
        "session_10",
    ]
    assert evalset.observations[-1].evidence == ("D3:1", "D1:1")


def test_longmemeval_abstention_is_the_abs_suffix_and_evidence_the_has_answer_turns() -> None:
    evalset = read_longmemeval(LONGMEMEVAL)
    assert [q.abstention for q in evalset.questions] == [False, False, True]
    assert evalset.questions[0].evidence == ("s-bike:0",)
    assert evalset.questions[1].evidence == ("s-berlin:0", "s-munich:0")
    assert evalset.questions[0].date == "2023/05/30 (Tue) 09:00"
    twice = copy.deepcopy(LONGMEMEVAL[1])
    twice["haystack_session_ids"] = ["same", "same"]
    sessions = read_longmemeval([twice]).conversations[0].sessions
    assert len({s.id for s in sessions}) == 2  # each session stays its own thread


@pytest.mark.parametrize(
    ("benchmark", "data", "needle"),
    [
        ("locomo", {"not": "a list"}, "conversation` must be an object"),
        ("locomo", [{"sample_id": "c", "conversation": {"speaker_a": "A"}}], "speaker_b"),
        ("locomo", [dict(LOCOMO[0], qa=[{"question": "q", "answer": "a", "category": 7}])], "1-5"),
        ("locomo", [dict(LOCOMO[0], qa=[{"question": {"x": 1}, "answer": "a", "category": 1}])],
         "qa[0].question: expected text"),
        ("locomo", [LOCOMO[0], LOCOMO[0]], "appears twice"),
        ("longmemeval", {"question_id": "x"}, "JSON list"),
        ("longmemeval", [dict(LONGMEMEVAL[0], question_type="chit-chat")], "unknown question_type"),
        ("longmemeval", [dict(LONGMEMEVAL[0], haystack_sessions=[[{"role": "tool"}]])],
         "role must be user or assistant"),
    ],
)  # fmt: skip
def test_a_file_in_the_wrong_shape_is_one_line_naming_the_place(
    benchmark: str, data: Any, needle: str
) -> None:
    reader = read_locomo if benchmark == "locomo" else read_longmemeval
    with pytest.raises(DatasetError) as caught:
        reader(data)
    assert needle in str(caught.value) and "\n" not in str(caught.value)


def test_a_deeply_nested_file_is_refused_in_one_line(tmp_path: Path) -> None:
    path = tmp_path / "deep.json"
    path.write_text("[" * 100_000 + "]" * 100_000)
    with pytest.raises(DatasetError, match="nested too deeply"):
        load_evalset("locomo", path)


@pytest.mark.parametrize(
    "conversation_id",
    ["alice@example.com", "auth0|abc", "alice_example_com", "x" * 1000, "\u202e\ud800", ""],
)
def test_every_conversation_id_becomes_a_valid_distinct_user(conversation_id: str) -> None:
    user = user_id_for("locomo", conversation_id, "Ann")
    assert validate_user_id(user) == user
    others = {user_id_for("locomo", c, "Ann") for c in ("alice@example.com", "auth0|abc", "")}
    assert user_id_for("locomo", conversation_id, "Ben") != user
    assert len(others) == 3 and user != user_id_for("longmemeval", conversation_id, "Ann")


def test_a_session_seen_by_each_speaker_and_its_hand_off_points() -> None:
    conversation = read_locomo(LOCOMO).conversations[0]
    session = conversation.sessions[0]
    ann = messages_for(conversation, session, "Ann")
    assert [m["role"] for m in ann] == ["user", "assistant", "user", "assistant"]
    # The session's date is each message's time (not text in the first turn any more).
    assert ann[0]["content"] == "Ann: Hi! I adopted a cat named Miso last week."
    assert {m["created_at"] for m in ann} == {"2023-05-08T13:00:00+00:00"}
    assert [m["id"] for m in ann] == ["D1:1", "D1:2", "D1:3", "D1:4"]
    assert hand_off_points(ann) == [2, 4]  # after each reply; the last is the flush
    ben = messages_for(conversation, session, "Ben")
    assert [m["role"] for m in ben] == ["assistant", "user", "assistant", "user"]
    assert hand_off_points(ben) == [3, 4]


@pytest.mark.parametrize(
    ("benchmark", "text", "correct"),
    [
        ("locomo", '{"reason": "same", "label": "CORRECT"}', True),
        ("locomo", 'Reasoning first. {"label": "WRONG"}', False),
        ("locomo", "CORRECT", True),
        ("locomo", "CORRECT or WRONG, hard to say", False),
        ("locomo", "", False),
        ("longmemeval", "Yes.", True),
        ("longmemeval", "no", False),
        ("longmemeval", "my eyes say no", False),
    ],
)
def test_verdicts_are_read_as_each_benchmark_reads_them(
    benchmark: Any, text: str, correct: bool
) -> None:
    assert read_verdict(benchmark, text) is correct


def test_locomo_headline_leaves_adversarial_out_and_longmemeval_averages_its_types() -> None:
    locomo = read_locomo(LOCOMO).questions
    graded = [Graded(q, q.category in ("single-hop", "adversarial")) for q in locomo]
    scores = accuracy("locomo", graded)
    # 3 single-hop right of the 7 questions in categories 1-4; adversarial 3 of 3 apart.
    assert (scores.overall.correct, scores.overall.total) == (3, 7)
    assert (scores.overall_all.correct, scores.overall_all.total) == (6, 10)
    assert (scores.abstention.correct, scores.abstention.total) == (3, 3)
    assert list(scores.by_category) == [
        "multi-hop", "temporal", "open-domain", "single-hop", "adversarial"
    ]  # fmt: skip
    lme = read_longmemeval(LONGMEMEVAL).questions
    scores = accuracy("longmemeval", [Graded(q, q.abstention) for q in lme])
    assert scores.task_averaged == pytest.approx(1 / 3)  # 0, 0 and 1 over three types
    assert (scores.overall.correct, scores.overall.total) == (1, 3)


def test_extraction_recall_precision_and_citations() -> None:
    evalset = read_locomo(LOCOMO).select(conversations=["conv-b"])
    facts = {
        "conv-b": [
            FactRecord("Cara", "Cara is a nurse in Porto", ("D1:1",)),  # cites the right turn
            FactRecord("Dan", "Dan bought a red bicycle", ("D2:2",)),  # cites a wrong one
            FactRecord("Dan", "Dan likes rivers", None),  # supports nothing
            FactRecord("Cara", "Dan adopted a parrot named Kiwi", None),  # the wrong speaker
        ]
    }
    score = extraction_score(evalset.observations, facts)
    assert (score.recalled, score.observations) == (2, 4)
    assert (score.supported, score.facts) == (2, 4)
    assert (score.cited_right, score.cited_checked) == (1, 2)


def test_cost_bills_cached_prompt_tokens_at_their_own_price() -> None:
    usage = Usage(calls=2, prompt_tokens=1_000_000, cached_tokens=400_000, completion_tokens=10_000)
    assert cost(usage, Prices(1.0, 4.0, 0.25)) == pytest.approx(0.6 + 0.1 + 0.04)
    assert cost(usage, Prices(1.0, 4.0)) == pytest.approx(1.0 + 0.04)
    assert cost(usage, None) is None


def test_the_estimate_cuts_a_long_session_exactly_where_the_worker_does() -> None:
    settings = MemqSettings(conversation_max_tokens=200, token_counting=False)
    messages = [
        Message("user" if i % 2 == 0 else "assistant", f"turn {i} " + "word " * 40, f"m{i}")
        for i in range(12)
    ]
    chunks = extraction_calls(messages, settings, estimate_tokens)
    # The worker: extract the oldest chunk that fits, store the watermark, run again for more.
    runs, watermark, budget = [], None, chunk_budget(settings, estimate_tokens)
    while True:
        selection = split_at_watermark(messages, watermark, 0, budget)
        if not selection.new:
            break
        runs.append(list(selection.new))
        watermark = selection.watermark
        if not selection.more:
            break
    assert len(chunks) > 1 and chunks == runs


def test_checkpoint_reloads_and_refuses_another_runs(tmp_path: Path) -> None:
    path = tmp_path / "checkpoint.jsonl"
    identity = {"benchmark": "locomo", "file": "/data/locomo10.json"}
    first = Checkpoint.open(path, identity)
    first.mark_session("conv-a", "Ann", "session_1", [1.5], "extracted")
    first.record_question("q1", answer="Miso", correct=True)
    first.close()
    with path.open("a") as journal:  # a kill tore the last line mid-write
        journal.write('{"question": "q2", "fields": {"answer": "Ki')
    again = Checkpoint.open(path, identity)
    assert again.session_done("conv-a", "Ann", "session_1") and again.resumed
    assert again.judged_questions() == frozenset({"q1"})
    assert again.question("q2") == {}  # that step is done again
    again.record_question("q2", answer="Kiwi")
    again.close()
    assert Checkpoint.open(path, identity).question("q2") == {"answer": "Kiwi"}
    with pytest.raises(CheckpointMismatch, match="--fresh"):
        Checkpoint.open(path, {**identity, "file": "/data/other.json"})
    assert not Checkpoint.open(path, {"other": 1}, fresh=True).resumed


def test_the_report_is_built_from_the_records_and_the_chart_escapes_what_it_shows() -> None:
    evalset = read_locomo(LOCOMO).select(limit=1)
    questions = {
        q.id: {
            "answer": "x",
            "correct": q.category == "single-hop",
            "block_tokens": 10 * (n + 1),
            "recall_ms": [1.0, 3.0],
            "answer_usage": {"calls": 1, "prompt_tokens": 100, "cached_tokens": 0,
                             "completion_tokens": 5},
        }
        for n, q in enumerate(evalset.questions)
    }  # fmt: skip
    sessions = {"s": {"hand_off_ms": [2.0, 4.0], "outcome": "extracted"}}
    # The workers' bill: 4 runs, 6 turns extracted, $0.0048 (the eval never re-prices it).
    delta = {
        "llm_requests:ok": 4, "prompt_tokens": 4000, "completion_tokens": 400,
        "billed_runs": 4, "turns_extracted": 6, "cost_nano_usd": 4_800_000,
    }  # fmt: skip
    settings = MemqSettings(token_counting=False)
    planned = estimate(
        evalset, settings, estimate_tokens,
        extraction_prices=None, answer_prices=None, judge_prices=None,
    )  # fmt: skip
    prices = Prices(1.0, 2.0)
    result = build_result(
        evalset, questions, sessions, {}, delta,
        Models("extractor", "answerer", "<script>judge</script>"),
        PriceTable(prices, prices, prices, "--price-input/--price-output"), estimate_json(planned),
    )  # fmt: skip
    assert result["accuracy"]["by_category"]["single-hop"]["correct"] == 1
    assert result["extraction"]["cost_usd"] == pytest.approx((4000 + 800) / 1e6)
    assert result["extraction"]["cost_per_1000_turns_usd"] == pytest.approx(4.8e-3 * 1000 / 6)
    assert result["tokens_per_question"]["max"] == 60  # six questions: 10 … 60 tokens
    assert result["answer"]["prompt_tokens"] == 600
    text = markdown(result)
    assert "| single-hop | 1 | 1 | 100.0% |" in text and "4 LLM calls" in text
    chart = svg_chart(result)
    assert "<script>" not in chart and "&lt;script&gt;judge" in chart


def test_text_with_control_characters_and_lone_surrogates_reads_as_encodable_text() -> None:
    sample = copy.deepcopy(LOCOMO[0])
    sample["conversation"]["session_1"][0]["text"] = "I like \x00tea\u202e and \ud800 cake 😀"
    turn = read_locomo([sample]).conversations[0].sessions[0].turns[0]
    assert turn.text == "I like \x00tea\u202e and \ufffd cake 😀"
    turn.text.encode("utf-8")  # what Redis and the model client need


@pytest.fixture
def endpoint(monkeypatch: pytest.MonkeyPatch) -> None:
    """A configured model endpoint (never called: these runs stop before spending)."""
    monkeypatch.setenv("MEMQ_LLM_BASE_URL", "http://127.0.0.1:9/v1")
    monkeypatch.setenv("MEMQ_TOKEN_COUNTING", "false")


def test_the_estimate_is_printed_and_nothing_is_spent_without_a_yes(
    endpoint: None, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    data = str(DATA / "locomo_small.json")
    out = str(tmp_path / "out")
    assert main(["eval", "locomo", data, "--out", out, "--estimate-only"]) == 0
    printed = capsys.readouterr().out
    assert "2 conversations, 4 sessions, 12 turns, 12 hand-offs, 10 questions" in printed
    assert "extraction (gpt-4o-mini): 8 calls" in printed and "unknown (no prices)" in printed
    # Not a terminal and no --yes: one line, exit 1, and no checkpoint (nothing started).
    assert main(["eval", "locomo", data, "--out", out, "--price-input", "0.15",
                 "--price-output", "0.6"]) == 1  # fmt: skip
    captured = capsys.readouterr()
    assert "$" in captured.out and "re-run with --yes" in captured.err
    assert not (tmp_path / "out" / "checkpoint.jsonl").exists()
    assert main(["eval", "locomo", data, "--out", out, "--conversations", "conv-b",
                 "--estimate-only"]) == 0  # fmt: skip
    assert "1 conversations, 2 sessions, 6 turns" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["eval", "locomo", "/nonexistent/locomo10.json"], "no such file"),
        (["eval", "longmemeval", str(DATA / "locomo_small.json")], "question_id"),
        (["eval", "locomo", str(DATA / "locomo_small.json"), "--conversations", "conv-z"],
         "no conversation 'conv-z'"),
        (["eval", "locomo", str(DATA / "locomo_small.json"), "--price-input", "1"],
         "--price-output"),
        (["eval", "locomo", str(DATA / "locomo_small.json"), "--concurrency", "0"],
         "at least 1"),
    ],
)  # fmt: skip
def test_bad_input_is_one_line(
    endpoint: None, argv: list[str], needle: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main([*argv, "--estimate-only"]) == 1
    err = capsys.readouterr().err.strip()
    assert needle in err and "\n" not in err and "Traceback" not in err


def test_without_a_model_endpoint_it_says_what_to_set(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert main(["eval", "locomo", str(DATA / "locomo_small.json"), "--estimate-only"]) == 1
    assert "MEMQ_LLM_BASE_URL" in capsys.readouterr().err


def test_observations_in_other_shapes_are_skipped_not_fatal() -> None:
    sample = copy.deepcopy(LOCOMO[0])
    sample["observation"] = {"session_1_observation": [], "session_2_observation": "a note"}
    assert read_locomo([sample]).observations == ()


def test_the_message_ids_a_fact_cites_are_read_wherever_provenance_puts_them() -> None:
    from memq.evaluation.runner import cited_ids

    assert cited_ids({"content": "x"}) is None
    assert cited_ids({"source_message_ids": ["D1:1", 7, "D1:2"]}) == ("D1:1", "D1:2")
    assert cited_ids({"sources": [{"thread_id": "t", "message_ids": ["D2:1"]}]}) == ("D2:1",)
    assert cited_ids({"citations": [{"message_id": "D3:4"}]}) == ("D3:4",)


def test_a_blank_turn_is_left_out_and_a_photo_alone_is_kept() -> None:
    sample = copy.deepcopy(LOCOMO[0])
    session = sample["conversation"]["session_2"]
    session.insert(1, {"speaker": "Ben", "dia_id": "D2:9", "text": "  "})
    session.insert(1, {"speaker": "Ben", "dia_id": "D2:8", "text": "", "blip_caption": "a cello"})
    turns = read_locomo([sample]).conversations[0].sessions[1].turns
    assert [t.id for t in turns] == ["D2:1", "D2:8", "D2:2"]
    assert turns[1].text == "[shares a photo: a cello]"


def test_message_level_sources_are_read_back_as_turn_ids_and_run_level_ones_cite_nothing() -> None:
    from memq.evaluation.runner import cited_ids, turn_digests

    turn_of = turn_digests(["D1:1", "D1:2", "D2:7"])
    (d1, d2, d3) = turn_of
    message_level = {"sources": [{"attribution": "message", "messages": [d1, d3, "id:unknown"]}]}
    run_level = {"sources": [{"attribution": "run", "messages": [d1, d2, d3]}]}
    assert cited_ids(message_level, turn_of) == ("D1:1", "D2:7")
    assert cited_ids(run_level, turn_of) is None  # a run, not a turn: never a guessed citation
    assert cited_ids(message_level) is None  # without the turns, digests name nothing
    assert all(d.startswith("id:") and len(d) == 19 for d in turn_of)  # never the raw id
