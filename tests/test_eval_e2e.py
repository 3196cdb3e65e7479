"""`memq eval` end to end: the real command (a subprocess, as a user runs it) replays the small
synthetic data sets in tests/data/eval through the producer, a real Celery worker and beat, the
real `openai` client against the scripted model (which extracts, answers and judges
deterministically: memq.testing.eval_responder.evaluation_responder), and writes its results.

Every expected figure below is worked out by hand from the data files and the scripted rules; the
comments say how.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path
from typing import Any

import pytest

from memq.core.settings import MemqSettings
from memq.evaluation.prompts import ANSWER_SYSTEM, JUDGE_SYSTEM
from memq.testing.celery_procs import REPO_ROOT, CeleryProcs, memq_env
from memq.testing.eval_responder import evaluation_responder
from memq.testing.openai_server import ScriptedOpenAI
from memq.testing.waiting import DEADLINE_SECONDS, wait_for
from storage import get_storage
from tests.support.scenarios import stack_settings

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

DATA = Path(__file__).parent / "data" / "eval"
LOCOMO = DATA / "locomo_small.json"
LONGMEMEVAL = DATA / "longmemeval_small.json"


def kind(request: dict[str, Any]) -> str:
    system = str(request["messages"][0]["content"])
    return {ANSWER_SYSTEM: "answer", JUDGE_SYSTEM: "judge"}.get(system, "extraction")


def calls(server: ScriptedOpenAI, wanted: str) -> list[dict[str, Any]]:
    with server.lock:
        return [r for r in server.requests if kind(r) == wanted]


def eval_command(benchmark: str, data: Path, out: Path, *extra: str) -> list[str]:
    return [
        sys.executable, "-m", "memq.cli", "eval", benchmark, str(data), "--out", str(out),
        "--external-workers", "--yes", "--price-input", "1.0", "--price-output", "2.0", *extra,
    ]  # fmt: skip


def child_env(settings: MemqSettings) -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MEMQ_") and k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")
    }
    env.update(memq_env(settings))
    env["PYTHONPATH"] = str(REPO_ROOT)
    return env


@pytest.fixture
def eval_stack(
    make_settings: Any, openai_server: ScriptedOpenAI, celery_procs: CeleryProcs
) -> tuple[MemqSettings, MemqSettings]:
    """(the user's settings, the evaluation's): a worker and beat on the eval key prefix, which
    `memq eval` derives from the user's by default."""
    openai_server.responder = evaluation_responder
    settings: MemqSettings = stack_settings(make_settings, openai_server)
    # The workers keep the bill `memq eval` reports, at the prices its command line names.
    evaluation = settings.model_copy(
        update={
            "key_prefix": f"{settings.key_prefix}-eval",
            "llm_price_input_per_million": 1.0,
            "llm_price_output_per_million": 2.0,
        }
    )
    env = memq_env(evaluation)
    celery_procs.start_worker(env, concurrency=4, pool="threads")
    celery_procs.start_beat(env)
    return settings, evaluation


def test_locomo_scores_cost_and_latency_come_out_as_computed_by_hand(
    eval_stack: tuple[MemqSettings, MemqSettings],
    openai_server: ScriptedOpenAI,
    redis_client: Any,
    tmp_path: Path,
) -> None:
    settings, evaluation = eval_stack
    out = tmp_path / "results"
    done = subprocess.run(
        eval_command("locomo", LOCOMO, out),
        env=child_env(settings), capture_output=True, text=True, timeout=180, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "results.json").read_text())
    acc = result["accuracy"]["by_category"]
    # The scripted answer is the fact sharing most content words with the question:
    # conv-a: Miso (single-hop, right), cello (multi-hop, right), the Lisbon fact has no date
    # (temporal, wrong), nothing about concerts (open-domain: "not available", wrong), "Ben's
    # cat" finds Ann's cat (adversarial, wrong), "football team" finds nothing (adversarial,
    # right); conv-b: nurse and red (single-hop, right), Sunday without "2023" (temporal, wrong),
    # "Cara's parrot" finds Dan's parrot (adversarial, wrong).
    assert {c: (s["correct"], s["total"]) for c, s in acc.items()} == {
        "single-hop": (3, 3),
        "multi-hop": (1, 1),
        "temporal": (0, 2),
        "open-domain": (0, 1),
        "adversarial": (1, 3),
    }
    assert result["accuracy"]["overall"] == {"correct": 4, "total": 7, "accuracy": 4 / 7}
    assert result["accuracy"]["overall_all"]["correct"] == 5
    by_id = {q["id"]: q for q in result["per_question"]}
    assert by_id["conv-a#q1"]["answer"] == "Hi! I adopted a cat named Miso last week."
    assert by_id["conv-a#q1"]["correct"] is True
    assert by_id["conv-a#q6"]["answer"] == "The information is not available."
    assert result["judge"] == settings.llm_model
    # One extraction per (speaker, session): 2 conversations x 2 sessions x 2 speakers.
    extractions = calls(openai_server, "extraction")
    assert len(extractions) == 8
    assert len(calls(openai_server, "answer")) == 10 and len(calls(openai_server, "judge")) == 10
    ex = result["extraction"]
    # The metrics hash holds what the server billed, request by request.
    billed_prompt = sum(r["usage_prompt"] for r in _usages(openai_server, "extraction"))
    billed_completion = sum(r["usage_completion"] for r in _usages(openai_server, "extraction"))
    assert (ex["calls"], ex["prompt_tokens"], ex["completion_tokens"]) == (
        8,
        billed_prompt,
        billed_completion,
    )
    assert ex["cached_tokens"] == 0  # the scripted server caches nothing here
    expected_cost = (billed_prompt * 1.0 + billed_completion * 2.0) / 1e6
    assert ex["cost_usd"] == pytest.approx(expected_cost)
    # Per 1,000 turns as `memq stats` counts them: the messages sent for extraction, each
    # session's messages once for each of its two speakers (2 x (4 + 2) x 2).
    assert ex["turns_extracted"] == 24
    assert ex["cost_per_1000_turns_usd"] == pytest.approx(expected_cost * 1000 / 24)
    # The estimate printed before the run: the same calls, tokens and cost within a quarter.
    estimated = result["estimate"]
    assert estimated["extraction"]["calls"] == 8
    assert estimated["answer"]["calls"] == estimated["judge"]["calls"] == 10
    assert estimated["extraction"]["prompt_tokens"] == pytest.approx(billed_prompt, rel=0.25)
    assert estimated["extraction_cost_usd"] == pytest.approx(expected_cost, rel=0.25)
    for model in ("answer", "judge"):  # the recalled block is only known after extraction
        spent = result[model if model == "answer" else "judge_usage"]["prompt_tokens"]
        assert estimated[model]["prompt_tokens"] == pytest.approx(spent, rel=0.5)
    assert "this run will spend about" in done.stdout and "8 calls" in done.stdout
    # Observations by hand: 9 of 10 recalled (Ann's dog was never said); 7 of 10 facts
    # supported: not "Mostly along the river.", nor the nurse line (2 of its 5 words are in the
    # observation), nor the bicycle line, which carries its photo's caption ("[shares a photo:
    # a red bicycle]": 3 of 7 words).
    quality = result["extraction_quality"]
    assert (quality["recalled"], quality["observations"]) == (9, 10)
    assert (quality["supported"], quality["facts"]) == (7, 10)
    # The scripted model cites the line each fact came from: every recalled observation's best
    # fact cites one of its turns, read back from the sources' message digests.
    assert (quality["cited_right"], quality["cited_checked"]) == (9, 9)
    # Twelve hand-offs: in each 4-turn session a reply, then the flush; in each 2-turn one the
    # flush alone — for each of the two speakers of both conversations.
    assert result["latency_ms"]["hand_off"]["count"] == 12
    assert result["latency_ms"]["recall"]["count"] == 20  # 10 questions x 2 speakers
    assert result["tokens_per_question"]["count"] == 10
    assert result["tokens_per_question"]["max"] > 0
    report = (out / "report.md").read_text()
    assert f"Judge: **{settings.llm_model}**" in report and "57.1%" in report
    chart = (out / "chart.svg").read_text()
    assert chart.count("<rect") == 6  # five categories and the overall bar
    assert "questions judged" in done.stderr  # the progress bars
    # The evaluation users are gone; the user's own prefix was never touched.
    assert get_storage(evaluation, redis=redis_client).list_users() == []
    assert not [k for k in redis_client.scan_iter(f"{evaluation.key_prefix}:*") if "eval-" in k]
    assert not list(redis_client.scan_iter(f"{settings.key_prefix}:*"))


def test_longmemeval_abstention_and_task_average_come_out_as_computed_by_hand(
    eval_stack: tuple[MemqSettings, MemqSettings],
    openai_server: ScriptedOpenAI,
    tmp_path: Path,
) -> None:
    settings, _ = eval_stack
    out = tmp_path / "lme"
    done = subprocess.run(
        eval_command("longmemeval", LONGMEMEVAL, out, "--no-progress", "--keep"),
        env=child_env(settings), capture_output=True, text=True, timeout=180, cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    result = json.loads((out / "results.json").read_text())
    acc = result["accuracy"]
    # Brompton is in the bike fact (right); "live now" finds "I live in Berlin." (wrong: Munich);
    # nothing mentions roses, so the answer abstains, which is right for an `_abs` question.
    assert {c: s["correct"] for c, s in acc["by_category"].items()} == {
        "knowledge-update": 0,
        "single-session-user": 1,
        "temporal-reasoning": 1,
    }
    assert acc["overall"]["correct"] == 2 and acc["overall"]["total"] == 3
    assert acc["task_averaged"] == pytest.approx(2 / 3)
    assert acc["abstention"] == {"correct": 1, "total": 1, "accuracy": 1.0}
    # One extraction per session: 2 + 2 + 1.
    assert len(calls(openai_server, "extraction")) == 5 == result["extraction"]["calls"]
    assert result["estimate"]["extraction"]["calls"] == 5
    assert result["extraction_quality"] is None  # LongMemEval has no observations
    assert "abstention" in (out / "report.md").read_text()


def test_a_run_killed_mid_way_resumes_without_paying_for_any_extraction_twice(
    eval_stack: tuple[MemqSettings, MemqSettings],
    openai_server: ScriptedOpenAI,
    tmp_path: Path,
) -> None:
    settings, _ = eval_stack
    slow_extraction = evaluation_responder

    def responder(request: dict[str, Any]) -> Any:
        reply = slow_extraction(request)
        if kind(request) == "extraction":
            reply.delay_seconds = 0.8  # a window for the kill while one is in flight
        return reply

    openai_server.responder = responder
    out = tmp_path / "resumed"
    command = eval_command("locomo", LOCOMO, out, "--no-progress", "--concurrency", "1")
    first = subprocess.Popen(
        command, env=child_env(settings), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
        cwd=tmp_path, start_new_session=True,
    )  # fmt: skip
    checkpoint = out / "checkpoint.jsonl"

    def sessions_done() -> int:
        try:
            return checkpoint.read_text().count('"session"')
        except OSError:
            return 0

    try:
        # conv-a's four sessions and its questions, then the first of conv-b's: kill then.
        wait_for(lambda: sessions_done() >= 5, what="five sessions extracted")
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=10)
    assert first.returncode == -signal.SIGKILL
    spent_before = len(calls(openai_server, "extraction"))
    assert 5 <= spent_before < 8
    assert len(calls(openai_server, "answer")) == 6  # conv-a's questions, answered once

    second = subprocess.run(
        command, env=child_env(settings), capture_output=True, text=True, timeout=180,
        cwd=tmp_path,
    )  # fmt: skip
    assert second.returncode == 0, second.stderr[-3000:]
    assert "still to spend (resuming)" in second.stdout
    extractions = calls(openai_server, "extraction")
    assert len(extractions) == 8  # each (speaker, session) once, across both runs
    slots = [_conversation_slot(r) for r in extractions]
    assert len(set(slots)) == 8
    assert len(calls(openai_server, "answer")) == 10 and len(calls(openai_server, "judge")) == 10
    result = json.loads((out / "results.json").read_text())
    assert result["extraction"]["calls"] == 8  # from the metrics, across the kill
    assert result["estimate"]["extraction"]["calls"] == 8  # the first start's estimate
    assert result["accuracy"]["overall"]["correct"] == 4


def _conversation_slot(request: dict[str, Any]) -> str:
    text = str(request["messages"][-1]["content"])
    return text[text.index("<conversation>") :]


def _usages(server: ScriptedOpenAI, wanted: str) -> list[dict[str, int]]:
    from memq.testing.eval_responder import evaluation_responder as respond
    from prompts.tokens import estimate_tokens

    found = []
    for request in calls(server, wanted):
        reply = respond(request)
        found.append(
            {"usage_prompt": reply.prompt_tokens, "usage_completion": reply.completion_tokens}
        )
        assert reply.prompt_tokens == estimate_tokens(
            "\n".join(str(m["content"]) for m in request["messages"])
        )
    return found


def test_memq_starts_its_own_workers_and_a_ctrl_c_stops_it_to_be_resumed(
    make_settings: Any, openai_server: ScriptedOpenAI, tmp_path: Path
) -> None:
    """No --external-workers: memq eval runs its own worker and ticker on the eval prefix."""
    # Every answer and judge call, and every extraction after the second, waits until the
    # Ctrl-C is sent: on a fast machine one extraction can take every session (they are handed
    # over before the first is claimed), and a run whose answers did not wait finished first.
    interrupted = threading.Event()
    extractions = itertools.count(1)
    asked = [0]

    def responder(request: dict[str, Any]) -> Any:
        reply = evaluation_responder(request)
        if kind(request) == "extraction":
            reply.delay_seconds = 0.4
            asked[0] = next(extractions)
            if asked[0] > 2:
                reply.release = interrupted
        else:
            reply.release = interrupted
        return reply

    openai_server.responder = responder
    # A held call must outlast the wait for the signal: with the usual 10 s client timeout a
    # slow run's held calls failed, were given up on, and the run ended by itself (exit 0).
    settings: MemqSettings = stack_settings(
        make_settings, openai_server, llm_timeout_seconds=DEADLINE_SECONDS
    )
    out = tmp_path / "own"
    command = [
        c for c in eval_command("longmemeval", LONGMEMEVAL, out, "--no-progress", "--workers", "2")
        if c != "--external-workers"
    ]  # fmt: skip
    # A suite started from a background shell (`.ci/run &`, nohup) inherits an ignored SIGINT,
    # and so would this child: it then ran to the end through the Ctrl-C and exited 0. A
    # terminal's foreground process has SIGINT at its default, as restored here.
    first = subprocess.Popen(
        command, env=child_env(settings), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        text=True, cwd=tmp_path,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
    )  # fmt: skip
    journal = out / "checkpoint.jsonl"
    try:
        wait_for(
            lambda: journal.exists() and journal.read_text().count('"session"') >= 2,
            what="two sessions extracted by memq's own worker",
        )
        first.send_signal(signal.SIGINT)  # what Ctrl-C sends
        interrupted.set()
        _, err = first.communicate(timeout=DEADLINE_SECONDS)
    finally:
        interrupted.set()
        if first.poll() is None:
            first.kill()
    assert first.returncode == 130, err[-2000:]
    second = subprocess.run(
        command, env=child_env(settings), capture_output=True, text=True, timeout=180,
        cwd=tmp_path,
    )  # fmt: skip
    assert second.returncode == 0, second.stderr[-3000:]
    # 2 + 2 + 1 sessions, each extracted at most once: sessions of one thread handed over before
    # the first is claimed are extracted together (the debounce), so fewer calls are fine.
    assert 1 <= len(calls(openai_server, "extraction")) <= 5
    result = json.loads((out / "results.json").read_text())
    assert result["accuracy"]["overall"]["correct"] == 2
    assert (out / "logs").is_dir()  # the own stack's worker and beat logs
