"""The soak's report names each failure with its evidence, and appends itself to a document."""

from __future__ import annotations

from pathlib import Path

from bench.soak.faults import Fault, FaultRecord
from bench.soak.harness import SoakConfig, SoakResult
from bench.soak.oracle import OracleInput, StoredFact, Turn, judge
from bench.soak.report import DOC_MARKER, append_to_doc, render

A, B = "M-00000000000a", "M-00000000000b"


def result() -> SoakResult:
    turns = [
        Turn(A, "su-0000000a", "agent-a", "th-1", produced_ms=1_000, acked=True, last_ack_ms=1_100),
        Turn(
            B,
            "su-0000000a",
            "agent-a",
            "th-1",
            produced_ms=2_000,
            acked=True,
            last_ack_ms=2_100,
            summarised=True,
        ),
    ]
    documents = {
        ("su-0000000a", "agent-a"): [
            StoredFact(f"code {A} (noted by model call 1)", 3_000),
            StoredFact(f"code {A} (noted by model call 2)", 4_000),
        ]
    }
    verdict = judge(
        OracleInput(turns, documents, {}, [], frozenset(), {"ctx": f"msg {B}"}, loss_windows=())
    )
    fault = FaultRecord(Fault(1.0, "worker_pause"), started_ms=1_500, detail="SIGSTOP worker 1")
    fault.recovered_ms = 2_500
    return SoakResult(
        config=SoakConfig(minutes=1),
        verdict=verdict,
        faults=[fault],
        crashes=[],
        producer_stats={},
        queue_stats={"due": 0, "inflight": 0, "dead": 0, "metrics": {"extractions": 2}},
        model_calls=3,
        model_outcomes={"ok": 2, "http_5xx": 1},
        drained=True,
        documents=documents,
        turns=turns,
        redis_dump={"ctx": f"msg {B}"},
        started_ms=1_000,
    )


def test_the_report_gives_the_evidence_of_each_failure() -> None:
    text = "\n".join(render(result()))
    assert "FAILED" in text and "**lost 1**" in text and "**duplicated 1**" in text
    assert f"{B} user=su-0000000a" in text and "summarised away" in text
    assert "0.6s after worker_pause" in text  # the fault before its acknowledgement
    assert "now ctx" in text  # where the lost marker still is
    assert "model call 1 stored +2.0s" in text and "model call 2 stored +3.0s" in text
    assert "| worker_pause | +0.5s | SIGSTOP worker 1 | 1.0 s" in text
    assert "1.50 calls per extracted version" in text


def test_reports_are_appended_under_one_section(tmp_path: Path) -> None:
    doc = tmp_path / "reliability.md"
    doc.write_text("# Reliability\n\ntext\n", encoding="utf-8")
    append_to_doc(["## Soak 1"], doc)
    append_to_doc(["## Soak 2"], doc)
    text = doc.read_text(encoding="utf-8")
    assert text.count(DOC_MARKER) == 1
    assert text.index("text") < text.index("## Soak 1") < text.index("## Soak 2")
