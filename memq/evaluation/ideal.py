"""`memq eval locomo FILE --ideal`: recall alone, with ideal facts and an ideal reader.

No model is called. Each subject's memory is seeded with the data set's own observations (LoCoMo's
``session_N_observation``) as facts — each said at its session's time (``session_N_date_time``),
citing the turns the observation names — and every question is recalled exactly as a run recalls
it (:class:`producer.injector.MemoryInjector` on a real storage backend, one block per subject).
With an embedding model configured (``MEMQ_EMBEDDING_MODEL``), the seeded facts are embedded by the
workers' client first, as extraction would have, so the block is ranked by memq's hybrid ranking.
The ideal reader answers right whenever the evidence reaches it, so what is measured is recall:
of the questions whose evidence is an observation, how many get one (``any``) or every (``all``)
evidence observation into the block; and, for the temporal questions whose evidence reaches the
block, how many blocks state the day that evidence was said (``temporal: day stated``).
"""

from __future__ import annotations

import json
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from pathlib import Path

from memq.core.models import Message
from memq.core.settings import MemqSettings
from memq.evaluation.dataset import (
    Conversation,
    EvalSet,
    Observation,
    Question,
    session_time,
    thread_id_for,
    user_id_for,
)
from prompts.injection import read_day_header, render_fact, said_day
from storage.base import MemoryStorage
from storage.document import Fact, MemoryDocument
from storage.sources import MAX_SOURCE_MESSAGES, Source
from worker.watermark import message_identity

IDEAL_FILE = "ideal.json"
TEMPORAL = "temporal"  # LoCoMo's category 2 (and the prefix of LongMemEval's temporal-reasoning)
IDEAL_CONFIDENCE = 0.9  # every observation is something its subject stated


def ideal_fact(observation: Observation, conversation: Conversation, learnt: datetime) -> Fact:
    """An observation as the fact a perfect extraction would have stored."""
    session = next((s for s in conversation.sessions if s.id == observation.session_id), None)
    said = None if session is None else session_time(session.date)
    turns = observation.evidence[:MAX_SOURCE_MESSAGES]
    source = Source(
        thread_id=thread_id_for(conversation.id, observation.session_id),
        messages=tuple(message_identity(Message("user", "", turn)) for turn in turns),
        roles=("user",),
        attribution="message",
        at=learnt,
        said_at=said,
    )
    return Fact(
        content=observation.text,
        category="context",
        confidence=IDEAL_CONFIDENCE,
        created_at=learnt,
        source="conversation",
        source_thread_id=source.thread_id,
        sources=[source],
        said_at=said,
    )


def ideal_documents(evalset: EvalSet, learnt: datetime) -> dict[tuple[str, str], MemoryDocument]:
    """Each (conversation, subject)'s document of ideal facts, in observation order."""
    by_id = {c.id: c for c in evalset.conversations}
    documents: dict[tuple[str, str], MemoryDocument] = {}
    for observation in evalset.observations:
        conversation = by_id.get(observation.conversation_id)
        if conversation is None:
            continue
        key = (conversation.id, observation.subject)
        document = documents.setdefault(key, MemoryDocument())
        document.facts.append(ideal_fact(observation, conversation, learnt))
    return documents


@dataclass
class Tally:
    questions: int = 0
    any_reached: int = 0
    all_reached: int = 0

    def to_json(self) -> dict[str, float | int | None]:
        return {
            "questions": self.questions,
            "any": self.any_reached,
            "all": self.all_reached,
            "any_rate": _rate(self.any_reached, self.questions),
            "all_rate": _rate(self.all_reached, self.questions),
        }


@dataclass
class IdealResult:
    """What the ideal run measured (see the module docstring)."""

    budget_tokens: int
    overall: Tally = field(default_factory=Tally)
    by_category: dict[str, Tally] = field(default_factory=dict)
    temporal_reached: int = 0
    temporal_day_stated: int = 0
    block_tokens: list[int] = field(default_factory=list)

    def count(self, category: str, reached_any: bool, reached_all: bool) -> None:
        for tally in (self.overall, self.by_category.setdefault(category, Tally())):
            tally.questions += 1
            tally.any_reached += reached_any
            tally.all_reached += reached_all

    def to_json(self) -> dict[str, object]:
        tokens = sorted(self.block_tokens)
        return {
            "budget_tokens": self.budget_tokens,
            "overall": self.overall.to_json(),
            "by_category": {name: t.to_json() for name, t in sorted(self.by_category.items())},
            "temporal_reached": self.temporal_reached,
            "temporal_day_stated": self.temporal_day_stated,
            "temporal_day_stated_rate": _rate(self.temporal_day_stated, self.temporal_reached),
            "block_tokens_p50": tokens[len(tokens) // 2] if tokens else None,
        }


def _rate(part: int, whole: int) -> float | None:
    return part / whole if whole else None


def evidence_of(question: Question, observations: Sequence[Observation]) -> list[Observation]:
    """The observations that state the question's evidence turns."""
    wanted = set(question.evidence)
    return [o for o in observations if wanted & set(o.evidence)]


def score_question(
    question: Question,
    evidence: Sequence[tuple[Observation, Fact]],
    blocks: Mapping[str, str],
    result: IdealResult,
) -> None:
    """Count one question: which of its evidence facts' lines are in their subject's block, and
    — temporal questions — whether each line that is states the day its fact was said."""
    reached: list[tuple[Fact, date | None]] = []
    days = {subject: stated_days(block) for subject, block in blocks.items()}
    for observation, fact in evidence:
        line = render_fact(fact)
        shown = days.get(observation.subject, {})
        if line in shown:
            reached.append((fact, shown[line]))
    result.count(question.category, bool(reached), len(reached) == len(evidence))
    if reached and question.category.startswith(TEMPORAL):
        result.temporal_reached += 1
        result.temporal_day_stated += all(
            (said := said_day(f)) is not None and said == day for f, day in reached
        )


def stated_days(block: str) -> dict[str, date | None]:
    """Each fact line of a block and the day the block says it was said (the header it is
    under, its year carried from the header before when it states none), None for a line under
    no day."""
    found: dict[str, date | None] = {}
    day: date | None = None
    previous: date | None = None
    for line in block.split("\n"):
        header = read_day_header(line, previous)
        if header is not None:
            day = previous = header
        elif line.startswith("- ["):
            found.setdefault(line, day)
        elif not line.strip() or line.endswith(":"):
            day = None  # a blank line or another section's title ends the day's group
    return found


def run_ideal(evalset: EvalSet, settings: MemqSettings, out_dir: Path) -> IdealResult:
    """Seed ideal facts on a private file storage, recall every question with evidence
    observations, and write ``ideal.json`` (and the report lines) to ``out_dir``."""
    from producer.injector import MemoryInjector
    from prompts.tokens import make_token_counter
    from storage import get_storage

    count = make_token_counter(settings.token_counting)
    learnt = datetime.now(UTC)
    result = IdealResult(settings.injected_memory_max_tokens)
    with tempfile.TemporaryDirectory(prefix="memq-ideal-") as folder:
        private = settings.model_copy(update={"storage": "file", "storage_dir": Path(folder)})
        storage = get_storage(private)
        documents = ideal_documents(evalset, learnt)
        facts_of: dict[int, Fact] = {}
        for (conv_id, subject), document in documents.items():
            storage.save(user_id_for(evalset.benchmark, conv_id, subject), None, document)
        if private.embedding_model:
            _embed_facts(storage, private, [user_id_for(evalset.benchmark, *k) for k in documents])
        for key, document in documents.items():
            mine = [o for o in evalset.observations if (o.conversation_id, o.subject) == key]
            facts_of.update({id(o): f for o, f in zip(mine, document.facts, strict=True)})
        injector = MemoryInjector(private, storage)
        by_id = {c.id: c for c in evalset.conversations}
        for question in evalset.questions:
            conversation = by_id[question.conversation_id]
            mine = [o for o in evalset.observations if o.conversation_id == conversation.id]
            evidence = evidence_of(question, mine)
            if not evidence or question.abstention:
                continue  # an adversarial question's "evidence" is not what it asks about
            blocks = {
                subject: injector.text(
                    user_id_for(evalset.benchmark, conversation.id, subject),
                    None,
                    query=question.question,
                )
                for subject in conversation.subjects
            }
            result.block_tokens.append(sum(count(b) for b in blocks.values()))
            score_question(question, [(o, facts_of[id(o)]) for o in evidence], blocks, result)
        injector.close()
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / IDEAL_FILE).write_text(json.dumps(result.to_json(), indent=2) + "\n")
    return result


def _embed_facts(storage: MemoryStorage, settings: MemqSettings, users: Sequence[str]) -> None:
    """Each seeded memory's fact vectors, as the workers store them after an extraction."""
    from worker.embeddings import OpenAIEmbedder, embed_missing

    embedder = OpenAIEmbedder(settings)
    try:
        for user in users:
            embed_missing(storage, user, None, embedder)
    finally:
        embedder.close()


def ideal_markdown(result: IdealResult) -> str:
    """The ideal run's report: evidence reaching the block per category, and the temporal line."""
    lines = [
        f"## Recall with ideal facts and an ideal reader ({result.budget_tokens} tokens per "
        "subject)",
        "",
        "| questions | evidence reaches the block (any) | all of it |",
        "| --- | --- | --- |",
    ]
    rows = [("all", result.overall), *sorted(result.by_category.items())]
    for name, tally in rows:
        lines.append(
            f"| {name} ({tally.questions}) | {_pct(tally.any_reached, tally.questions)} "
            f"| {_pct(tally.all_reached, tally.questions)} |"
        )
    lines += [
        "",
        f"temporal: day stated — {result.temporal_day_stated} of {result.temporal_reached} "
        f"temporal questions whose evidence reaches the block "
        f"({_pct(result.temporal_day_stated, result.temporal_reached)})",
    ]
    if result.block_tokens:
        median = sorted(result.block_tokens)[len(result.block_tokens) // 2]
        lines.append(f"block tokens (both subjects), median: {median}")
    return "\n".join(lines) + "\n"


def _pct(part: int, whole: int) -> str:
    return f"{100 * part / whole:.1f} %" if whole else "-"
