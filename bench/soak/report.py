"""The soak's report: what was produced, what became of it, how fast, and what each fault cost."""

from __future__ import annotations

import platform
import re
from collections import Counter
from datetime import UTC, datetime
from pathlib import Path

from bench.soak.harness import SoakResult
from bench.soak.oracle import MARKER, Turn, percentile

DOC_MARKER = "<!-- soak reports -->"


def _fmt_ms(value: int | None) -> str:
    return "n/a" if value is None else f"{value / 1000:.2f} s"


def _when(result: SoakResult, ms: int | None) -> str:
    return "?" if ms is None else f"+{(ms - result.started_ms) / 1000:.1f}s"


def _where(result: SoakResult, marker: str) -> str:
    keys = [key for key, value in result.redis_dump.items() if marker in value or marker in key]
    return ", ".join(k[:80] for k in keys[:3]) or "in no Redis key"


def _nearest_fault(result: SoakResult, ms: int | None) -> str:
    if ms is None:
        return ""
    before = [r for r in result.faults if r.started_ms <= ms and "crash" not in r.fault.kind]
    if not before:
        return ""
    last = before[-1]
    return f", {(ms - last.started_ms) / 1000:.1f}s after {last.fault.kind}"


def _lost_line(result: SoakResult, turn: Turn) -> str:
    ack = f"acked {_when(result, turn.last_ack_ms)}" if turn.acked else "spooled only"
    if turn.summarised:
        ack += ", then summarised away by its agent (its last hand-over was a flush)"
    return (
        f"  - {turn.marker} user={turn.user} agent={turn.agent} thread={turn.thread}, "
        f"produced {_when(result, turn.produced_ms)}, {ack}"
        f"{_nearest_fault(result, turn.last_ack_ms or turn.produced_ms)}; "
        f"now {_where(result, turn.marker)}"
    )


def render(result: SoakResult) -> list[str]:
    v, c = result.verdict, result.config
    stats = result.producer_stats
    extractions = int(result.queue_stats.get("completed_total", 0))
    answered = int(result.model_outcomes.get("ok", 0))
    calls_per = result.model_calls / answered if answered else float("nan")
    lags = v.lags_ms
    lines = [
        f"## Soak {datetime.now(UTC):%Y-%m-%d %H:%M} UTC: "
        f"{'PASSED' if result.passed else 'FAILED'} "
        f"({c.minutes:g} min, appendfsync {c.appendfsync})",
        "",
        f"- machine: {platform.node()} {platform.machine()}, Python {platform.python_version()}",
        f"- load: {c.rate:g} turns/s over {c.threads} threads of {c.users} users and {c.agents} "
        f"agents, {c.producers} agent replicas, {c.flush_fraction:.0%} flushes; debounce "
        f"{c.debounce_seconds:g}s, tick {c.tick_seconds:g}s, lease {c.lease_seconds:g}s; "
        f"workers: prefork x{c.prefork_concurrency} + threads x{c.thread_concurrency}, "
        f"{c.beats} beats; storage=redis",
        f"- turns produced {v.produced}, acknowledged by Redis {v.acknowledged}, "
        f"spooled (at least once) {stats.get('ever_spooled', 0)}, never acknowledged "
        f"{v.spooled_only}; producer counters: {_counters(stats)}",
        f"- extracted {v.extracted}, dead-lettered {v.dead_lettered}, of forgotten users "
        f"{v.forgotten_turns}",
        f"- **lost {len(v.lost)}**, lost within a Redis loss window {len(v.lost_in_window)}, "
        f"**duplicated {len(v.duplicated)}**, misplaced {len(v.misplaced)}, invalid documents "
        f"{len(v.invalid_documents)}, traces of forgotten users {len(v.forgotten_leaks)}",
        f"- LLM calls {result.model_calls}, {answered} answered: {calls_per:.2f} calls per "
        f"extracted version (retries of faults included); {extractions} completed extraction "
        f"runs (a run with nothing new calls no model); model outcomes "
        f"{dict(sorted(result.model_outcomes.items()))}",
        f"- extraction lag (hand-over -> fact stored): p50 {_fmt_ms(percentile(lags, 50))}, "
        f"p99 {_fmt_ms(percentile(lags, 99))}, max {_fmt_ms(max(lags) if lags else None)}",
        f"- queue at the end: due {result.queue_stats.get('due')}, inflight "
        f"{result.queue_stats.get('inflight')}, dead {result.queue_stats.get('dead')}"
        f"{'' if result.drained else ' (NOT drained)'}",
        f"- erasure used: {result.forget_method or 'none'}",
    ]
    if c.appendfsync == "always":
        lines.append("- durability: appendfsync always, so no acknowledged turn may be lost.")
    else:
        lines.append(
            f"- durability: appendfsync {c.appendfsync}; a kill -9 of Redis may drop the "
            f"acknowledgements of its last ~2 s: {len(v.lost_in_window)} turn(s) acknowledged "
            "only in that window were lost (counted apart, not as failures)."
        )
    lines += ["", "| fault | at | what | recovered in |", "| --- | --- | --- | --- |"]
    for record in result.faults:
        took = record.recovery_seconds
        lines.append(
            f"| {record.fault.kind} | {_when(result, record.started_ms)} | {record.detail} | "
            f"{'not recovered' if took is None else f'{took:.1f} s'} "
            f"{'; '.join(record.notes)} |"
        )
    if result.crashes:
        lines += ["", "Processes that exited on their own (restarted by the harness):"]
        lines += [
            f"- {_when(result, r.started_ms)} {r.detail}{_nearest_fault(result, r.started_ms)}"
            for r in result.crashes
        ]
    if v.failures:
        lines += ["", "Failures:"] + [f"- {line}" for line in v.failures]
    if v.lost:
        lines += ["", "Lost turns (first 10):"] + [_lost_line(result, t) for t in v.lost[:10]]
    if v.lost_in_window:
        lines += ["", "Lost within a loss window (first 5):"]
        lines += [_lost_line(result, t) for t in v.lost_in_window[:5]]
    if v.duplicated:
        lines += ["", "Duplicated markers (first 10):"]
        for marker in list(v.duplicated)[:10]:
            copies = [
                (key, fact)
                for key, facts in result.documents.items()
                for fact in facts
                if marker in MARKER.findall(fact.content)
            ]
            shown = "; ".join(
                f"{fact.content.rsplit('(', 1)[-1].rstrip(')')} stored "
                f"{_when(result, fact.created_ms)}{_nearest_fault(result, fact.created_ms)}"
                for _, fact in copies
            )
            lines.append(f"  - {marker} in {copies[0][0] if copies else '?'}: {shown}")
    if v.lost:
        summarised = sum(t.summarised for t in v.lost)
        lines.append(
            f"  ({summarised} of {len(v.lost)} lost turns were last carried by a flush, then "
            "dropped from the agent's history by a summary)"
        )
    if v.forgotten_leaks:
        lines += ["", "Traces of forgotten users, by kind:"]
        lines += [f"  - {n} x {kind}" for kind, n in leak_kinds(v.forgotten_leaks).most_common()]
        lines += ["", "Traces of forgotten users (first 10):"]
        lines += [f"  - {leak}" for leak in v.forgotten_leaks[:10]]
    slowest = sorted(v.lag_by_marker.items(), key=lambda item: -item[1])[:5]
    if slowest:
        turns = {t.marker: t for t in result.turns}
        lines += ["", "Slowest extractions (hand-over -> fact stored):"]
        for marker, lag in slowest:
            turn = turns.get(marker)
            produced = turn.produced_ms if turn else None
            lines.append(f"  - {marker}: {lag / 1000:.1f} s{_nearest_fault(result, produced)}")
    if v.invalid_documents:
        lines += ["", "Invalid documents (first 5):"]
        lines += [f"  - {key}: {why}" for key, why in v.invalid_documents[:5]]
    if v.misplaced:
        lines += ["", "Misplaced markers (first 5):"]
        lines += [f"  - {m} in {key}" for m, key in v.misplaced[:5]]
    return lines


_USER = re.compile(r"su-[0-9a-f]{8}")
_THREAD = re.compile(r"th-\d+")


def leak_kinds(leaks: list[str]) -> Counter[str]:
    """Leaks grouped by the shape of the key that holds them (ids replaced by placeholders)."""
    kinds: Counter[str] = Counter()
    for leak in leaks:
        shape = _THREAD.sub("<thread>", _USER.sub("<user>", MARKER.sub("<marker>", leak)))
        kinds[shape.split(" holds ")[0]] += 1
    return kinds


def _counters(stats: dict[str, object]) -> str:
    names = ("enqueued", "spooled", "replayed", "dropped", "errors", "spool_left")
    return ", ".join(f"{name} {stats.get(name, 0)}" for name in names)


def append_to_doc(lines: list[str], doc: Path) -> None:
    """Append the report under the soak section of docs/reliability.md (created if missing)."""
    text = doc.read_text(encoding="utf-8") if doc.exists() else ""
    if DOC_MARKER not in text:
        text = text.rstrip("\n") + (
            f"\n\n# Soak reports\n\nWritten by `python -m bench.soak --report` "
            f"(`make soak`); newest last.\n{DOC_MARKER}\n"
        )
    doc.write_text(text.rstrip("\n") + "\n\n" + "\n".join(lines) + "\n", encoding="utf-8")
