"""The result of a run as data (the JSON result file), as Markdown, and as an SVG bar chart.

Pure: everything comes from the checkpoint's records, the extraction spend read from the metrics
hash, the models' names and the prices. The chart is a small hand-written SVG (one bar per
category, the overall figure last), so the report needs no plotting library.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from html import escape
from typing import Any

from memq.core.metrics import parse_metrics, per_thousand_turns
from memq.evaluation.dataset import EvalSet
from memq.evaluation.estimate import Estimate
from memq.evaluation.scoring import (
    Accuracy,
    ExtractionScore,
    FactRecord,
    Graded,
    Prices,
    Usage,
    accuracy,
    cost,
    distribution,
    extraction_score,
)

CHART_FILE = "chart.svg"
# The shape of results.json (:func:`build_result`): raised whenever a field is renamed, moved or
# removed (CHANGELOG.md says what changed).
RESULT_VERSION = 1


@dataclass(frozen=True, slots=True)
class Models:
    extraction: str
    answer: str
    judge: str


@dataclass(frozen=True, slots=True)
class PriceTable:
    """The prices of the estimate and of the answer and judge calls. The extraction's cost is
    never priced here: it is the bill the workers recorded (:func:`extraction_bill`)."""

    extraction: Prices | None
    answer: Prices | None
    judge: Prices | None
    source: str  # where the prices came from ("--price-input/--price-output", "settings", "none")


def metrics_delta(now: Mapping[str, int], baseline: Mapping[str, int] | None) -> dict[str, int]:
    base = baseline or {}
    return {k: v - base.get(k, 0) for k, v in now.items() if k != "last_tick_ms"}


def extraction_bill(delta: Mapping[str, int], priced: bool) -> dict[str, Any]:
    """The extraction spend as the workers billed it, from a difference of the metrics hash: the
    counters `memq stats` shows, both lanes' tokens (cached, batch and flex at their prices) and
    the bill's runs and turns. ``priced``: the workers keep a bill (a price table is set), else
    the cost is unknown (None), never re-priced here."""
    bill = parse_metrics(delta)
    cost_usd = bill.cost_usd if priced else None
    calls = bill["billed_runs"]
    turns = bill["turns_extracted"]
    return {
        "calls": calls,
        "prompt_tokens": bill.both_lanes("prompt"),
        "cached_tokens": bill.both_lanes("cached"),
        "completion_tokens": bill.both_lanes("completion"),
        "batch_prompt_tokens": bill["batch_prompt_tokens"],
        "batch_cached_tokens": bill["batch_cached_tokens"],
        "batch_completion_tokens": bill["batch_completion_tokens"],
        "turns_extracted": turns,
        "cost_usd": cost_usd,
        "cost_per_1000_turns_usd": per_thousand_turns(cost_usd, turns),
        "calls_per_1000_turns": per_thousand_turns(float(calls), turns),
        "outcomes": bill.extractions,
    }


def _usage_of(records: Sequence[Mapping[str, Any]], key: str) -> Usage:
    total = Usage()
    for record in records:
        if key in record:
            total += Usage(**record[key])
    return total


def build_result(
    evalset: EvalSet,
    questions: Mapping[str, Mapping[str, Any]],
    sessions: Mapping[str, Mapping[str, Any]],
    facts: Mapping[str, Sequence[FactRecord]],
    delta: Mapping[str, int],
    models: Models,
    prices: PriceTable,
    planned: Mapping[str, Any],
) -> dict[str, Any]:
    """``planned``: :func:`estimate_json` of what the run's first start estimated."""
    graded = [
        Graded(q, bool(questions[q.id]["correct"]))
        for q in evalset.questions
        if "correct" in questions.get(q.id, {})
    ]
    scores = accuracy(evalset.benchmark, graded)
    records = [questions[q.id] for q in evalset.questions if q.id in questions]
    block_tokens = [float(r["block_tokens"]) for r in records if "block_tokens" in r]
    recall_ms = [t for r in records for t in r.get("recall_ms", [])]
    hand_off_ms = [t for s in sessions.values() for t in s["hand_off_ms"]]
    answer, judge = _usage_of(records, "answer_usage"), _usage_of(records, "judge_usage")
    turns = sum(c.turn_count for c in evalset.conversations)
    extracted = extraction_score(evalset.observations, facts) if evalset.observations else None
    return {
        "version": RESULT_VERSION,
        "benchmark": evalset.benchmark,
        "models": asdict(models),
        "judge": models.judge,
        "conversations": len(evalset.conversations),
        "turns": turns,
        "questions": len(evalset.questions),
        "graded": len(graded),
        "accuracy": _accuracy_json(scores),
        "tokens_per_question": asdict(distribution(block_tokens)),
        "extraction": extraction_bill(delta, prices.extraction is not None),
        "answer": {**_usage_json(answer), "cost_usd": cost(answer, prices.answer)},
        "judge_usage": {**_usage_json(judge), "cost_usd": cost(judge, prices.judge)},
        "prices": {
            "source": prices.source,
            "extraction": asdict(prices.extraction) if prices.extraction else None,
            "answer": asdict(prices.answer) if prices.answer else None,
            "judge": asdict(prices.judge) if prices.judge else None,
        },
        "latency_ms": {
            "hand_off": asdict(distribution(hand_off_ms)),
            "recall": asdict(distribution(recall_ms)),
        },
        "extraction_quality": _extraction_json(extracted),
        "estimate": dict(planned),
        "per_question": [
            {
                "id": q.id,
                "conversation": q.conversation_id,
                "category": q.category,
                "abstention": q.abstention,
                "question": q.question,
                "gold": q.answer,
                "answer": questions.get(q.id, {}).get("answer"),
                "correct": questions.get(q.id, {}).get("correct"),
                "block_tokens": questions.get(q.id, {}).get("block_tokens"),
            }
            for q in evalset.questions
        ],
    }


def estimate_json(planned: Estimate) -> dict[str, Any]:
    return {
        "extraction": _usage_json(planned.extraction),
        "answer": _usage_json(planned.answer),
        "judge": _usage_json(planned.judge),
        "extraction_cost_usd": planned.extraction_cost,
        "total_cost_usd": planned.total_cost,
    }


def _usage_json(usage: Usage) -> dict[str, int]:
    return asdict(usage)


def _score_json(correct: int, total: int) -> dict[str, Any]:
    return {"correct": correct, "total": total, "accuracy": correct / total if total else None}


def _accuracy_json(scores: Accuracy) -> dict[str, Any]:
    return {
        "by_category": {
            name: _score_json(s.correct, s.total) for name, s in scores.by_category.items()
        },
        "overall": _score_json(scores.overall.correct, scores.overall.total),
        "overall_all": _score_json(scores.overall_all.correct, scores.overall_all.total),
        "task_averaged": scores.task_averaged,
        "abstention": _score_json(scores.abstention.correct, scores.abstention.total),
    }


def _extraction_json(score: ExtractionScore | None) -> dict[str, Any] | None:
    if score is None:
        return None
    return {
        **asdict(score),
        "recall": score.recall,
        "precision": score.precision,
        "citation_accuracy": score.citation_accuracy,
    }


# --- Markdown
def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{100 * value:.1f}%"


def _money(value: float | None) -> str:
    return "n/a (no prices)" if value is None else f"${value:,.4f}"


def _ms(lat: Mapping[str, Any]) -> str:
    if not lat["count"]:
        return "n/a"
    return f"p50 {lat['p50']:.1f} ms, p95 {lat['p95']:.1f} ms, max {lat['max']:.1f} ms"


def markdown(result: Mapping[str, Any]) -> str:
    acc = result["accuracy"]
    lines = [
        f"# memq eval: {result['benchmark']}",
        "",
        f"Judge: **{result['judge']}** · answer model: {result['models']['answer']} · "
        f"extraction model: {result['models']['extraction']}",
        f"{result['conversations']} conversations, {result['turns']} turns, "
        f"{result['graded']} of {result['questions']} questions graded.",
        "",
        f"![accuracy per category]({CHART_FILE})",
        "",
        "| category | correct | questions | accuracy |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, score in acc["by_category"].items():
        lines.append(
            f"| {name} | {score['correct']} | {score['total']} | {_pct(score['accuracy'])} |"
        )
    overall = acc["overall"]
    headline = "overall (categories 1-4)" if result["benchmark"] == "locomo" else "overall"
    lines.append(
        f"| **{headline}** | {overall['correct']} | {overall['total']} | "
        f"**{_pct(overall['accuracy'])}** |"
    )
    if result["benchmark"] == "locomo":
        every = acc["overall_all"]
        lines.append(
            f"| overall with adversarial | {every['correct']} | {every['total']} | "
            f"{_pct(every['accuracy'])} |"
        )
    else:
        lines.append(f"| task-averaged | | | {_pct(acc['task_averaged'])} |")
        ab = acc["abstention"]
        lines.append(
            f"| abstention (`_abs`) | {ab['correct']} | {ab['total']} | {_pct(ab['accuracy'])} |"
        )
    ex, tq = result["extraction"], result["tokens_per_question"]
    batch = (
        f" ({ex['batch_prompt_tokens']:,} prompt tokens in batch jobs)"
        if ex["batch_prompt_tokens"]
        else ""
    )
    lines += [
        "",
        "## Cost",
        "",
        f"- Tokens per question (the recalled block): mean {tq['mean'] or 0:.0f}, "
        f"p50 {tq['p50'] or 0:.0f}, p95 {tq['p95'] or 0:.0f}, max {tq['max'] or 0:.0f}.",
        f"- Extraction (the workers' bill): {ex['calls']:,} LLM calls, "
        f"{ex['prompt_tokens']:,} prompt tokens (cached: {ex['cached_tokens']:,}){batch}, "
        f"{ex['completion_tokens']:,} completion tokens; cost {_money(ex['cost_usd'])}; "
        f"per 1,000 turns extracted ({ex['turns_extracted']:,}): "
        f"{ex['calls_per_1000_turns'] or 0:.1f} calls, {_money(ex['cost_per_1000_turns_usd'])}.",
        f"- Answer model: {result['answer']['calls']:,} calls, "
        f"{result['answer']['prompt_tokens']:,} prompt tokens, "
        f"{_money(result['answer']['cost_usd'])}; judge: {result['judge_usage']['calls']:,} calls, "
        f"{result['judge_usage']['prompt_tokens']:,} prompt tokens, "
        f"{_money(result['judge_usage']['cost_usd'])}. Prices: {result['prices']['source']}.",
        f"- Estimated before the run: {result['estimate']['extraction']['calls']:,} extraction "
        f"calls, {result['estimate']['extraction']['prompt_tokens']:,} prompt tokens, "
        f"total {_money(result['estimate']['total_cost_usd'])}.",
        "",
        "## Latency",
        "",
        f"- Hand-off (`after_agent` / flush): {_ms(result['latency_ms']['hand_off'])}.",
        f"- Recall (`MemoryInjector.block`): {_ms(result['latency_ms']['recall'])}.",
    ]
    quality = result["extraction_quality"]
    if quality is not None:
        lines += [
            "",
            "## Extraction against the data set's observations",
            "",
            f"- Recall {_pct(quality['recall'])} ({quality['recalled']} of "
            f"{quality['observations']} observations), precision {_pct(quality['precision'])} "
            f"({quality['supported']} of {quality['facts']} facts); content-word match, a lower "
            "bound.",
            "- Facts citing the right turn: "
            + (
                f"{_pct(quality['citation_accuracy'])} of {quality['cited_checked']}"
                if quality["cited_checked"]
                else "n/a (no fact cites its messages)"
            )
            + ".",
        ]
    return "\n".join(lines) + "\n"


# --- the chart
def svg_chart(result: Mapping[str, Any]) -> str:
    acc = result["accuracy"]
    bars = [(name, s["accuracy"]) for name, s in acc["by_category"].items()]
    bars.append(("overall", acc["overall"]["accuracy"]))
    width, bar, gap, top, height = 60 + len(bars) * 90, 60, 30, 30, 200
    parts = [
        f'<svg xmlns="http://www.w3.org/2000/svg" width="{width}" height="{top + height + 60}" '
        'font-family="sans-serif" font-size="12">',
        f'<text x="10" y="18">{escape(result["benchmark"])}: accuracy per category '
        f"(judge {escape(str(result['judge']))})</text>",
        f'<line x1="40" y1="{top + height}" x2="{width - 10}" y2="{top + height}" stroke="#333"/>',
    ]
    for index, (name, value) in enumerate(bars):
        x = 50 + index * (bar + gap)
        share = value or 0.0
        h = round(height * share)
        colour = "#2f6fb0" if name != "overall" else "#b05a2f"
        parts.append(
            f'<rect x="{x}" y="{top + height - h}" width="{bar}" height="{h}" fill="{colour}"/>'
        )
        parts.append(
            f'<text x="{x + bar / 2}" y="{top + height - h - 4}" text-anchor="middle">'
            f"{escape(_pct(value))}</text>"
        )
        parts.append(
            f'<text x="{x + bar / 2}" y="{top + height + 16}" text-anchor="middle">'
            f"{escape(name[:14])}</text>"
        )
    parts.append("</svg>")
    return "\n".join(parts) + "\n"
