"""Scores from graded questions, extracted facts and measured latencies: pure functions.

Accuracy is reported as each benchmark's published numbers are: LoCoMo per category with the
overall figure over categories 1-4 (the published numbers leave adversarial questions out; they are
reported beside it, and an overall figure that includes them too); LongMemEval per question type,
overall, averaged over the types, and over the abstention (``_abs``) questions apart.

Extraction recall and precision compare the facts memq kept with LoCoMo's per-session
observations by content words (lower-cased words of three letters or more, and numbers, minus
common function words): an observation is recalled when one fact holds at least half its words,
a fact is supported when one observation holds at least half of the fact's. A lexical match, so
a paraphrase can be missed: read it as a lower bound, and compare runs with each other.
"""

from __future__ import annotations

import math
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

from memq.evaluation.dataset import Benchmark, Observation, Question
from memq.evaluation.locomo import ADVERSARIAL, CATEGORIES
from memq.evaluation.longmemeval import QUESTION_TYPES

MATCH_THRESHOLD = 0.5
_WORD = re.compile(r"[^\W_]+")
_STOP_WORDS = (
    "the and for with was were are been being has have had did does not but from that this "
    "they them their there then than what when where which who whom why how its it's his her "
    "hers him she you your yours our ours out about into onto over also just very really some "
    "any all can could would should will shall may might must one"
)
_STOP = frozenset(_STOP_WORDS.split())


@dataclass(frozen=True, slots=True)
class Graded:
    question: Question
    correct: bool


@dataclass(frozen=True, slots=True)
class Score:
    correct: int
    total: int

    @property
    def accuracy(self) -> float | None:
        return self.correct / self.total if self.total else None


@dataclass(frozen=True, slots=True)
class Accuracy:
    by_category: dict[str, Score]
    overall: Score  # the benchmark's headline figure
    overall_all: Score  # every question, adversarial/abstention included
    task_averaged: float | None  # LongMemEval: the mean of the per-type accuracies
    abstention: Score  # the adversarial / _abs questions alone


def _score(items: Iterable[Graded]) -> Score:
    graded = list(items)
    return Score(sum(g.correct for g in graded), len(graded))


def accuracy(benchmark: Benchmark, graded: Sequence[Graded]) -> Accuracy:
    order = {name: rank for rank, name in enumerate((*CATEGORIES.values(), *QUESTION_TYPES))}
    categories = sorted({g.question.category for g in graded}, key=lambda c: (order.get(c, 99), c))
    by_category = {c: _score(g for g in graded if g.question.category == c) for c in categories}
    headline = [g for g in graded if g.question.category != ADVERSARIAL]
    if benchmark == "longmemeval":
        headline = list(graded)
    per_type = [s.accuracy for s in by_category.values() if s.accuracy is not None]
    return Accuracy(
        by_category=by_category,
        overall=_score(headline),
        overall_all=_score(graded),
        task_averaged=(sum(per_type) / len(per_type))
        if benchmark == "longmemeval" and per_type
        else None,
        abstention=_score(g for g in graded if g.question.abstention),
    )


def content_words(text: str) -> frozenset[str]:
    return frozenset(
        w for w in _WORD.findall(text.casefold()) if (len(w) >= 3 or w.isdigit()) and w not in _STOP
    )


def overlap(part: frozenset[str], whole: frozenset[str]) -> float:
    """How much of ``part``'s words ``whole`` holds (0 for an empty part)."""
    return len(part & whole) / len(part) if part else 0.0


@dataclass(frozen=True, slots=True)
class FactRecord:
    """A fact as kept at the end of a conversation, and the turns it cites (None: it cites
    none, or memq does not record citations)."""

    subject: str
    content: str
    cited: tuple[str, ...] | None = None


@dataclass(frozen=True, slots=True)
class ExtractionScore:
    observations: int
    recalled: int
    facts: int
    supported: int
    cited_checked: int  # recalled observations whose best fact cites turns
    cited_right: int  # … of which the citation includes one of the observation's turns

    @property
    def recall(self) -> float | None:
        return self.recalled / self.observations if self.observations else None

    @property
    def precision(self) -> float | None:
        return self.supported / self.facts if self.facts else None

    @property
    def citation_accuracy(self) -> float | None:
        return self.cited_right / self.cited_checked if self.cited_checked else None


def extraction_score(
    observations: Sequence[Observation], facts: Mapping[str, Sequence[FactRecord]]
) -> ExtractionScore:
    """``facts``: per conversation id, the facts of its subjects."""
    recalled = cited_checked = cited_right = supported = total_facts = 0
    for conv_id, records in facts.items():
        mine = [o for o in observations if o.conversation_id == conv_id]
        fact_words = [(f, content_words(f.content)) for f in records]
        total_facts += len(records)
        for fact, words in fact_words:
            if any(
                overlap(words, content_words(o.text)) >= MATCH_THRESHOLD
                for o in mine
                if o.subject == fact.subject
            ):
                supported += 1
        for obs in mine:
            obs_words = content_words(obs.text)
            best: tuple[float, FactRecord | None] = (0.0, None)
            for fact, words in fact_words:
                if fact.subject == obs.subject:
                    share = overlap(obs_words, words)
                    if share > best[0]:
                        best = (share, fact)
            share, matched = best
            if matched is None or share < MATCH_THRESHOLD:
                continue
            recalled += 1
            if matched.cited:
                cited_checked += 1
                cited_right += bool(set(matched.cited) & set(obs.evidence))
    considered = sum(1 for o in observations if o.conversation_id in facts)
    return ExtractionScore(considered, recalled, total_facts, supported, cited_checked, cited_right)


@dataclass(frozen=True, slots=True)
class Distribution:
    """Count, mean, median, 95th percentile and maximum of some samples (None when empty)."""

    count: int
    mean: float | None
    p50: float | None
    p95: float | None
    max: float | None


def percentile(values: Sequence[float], fraction: float) -> float:
    """Nearest-rank percentile of a non-empty sequence."""
    ordered = sorted(values)
    rank = max(1, math.ceil(fraction * len(ordered)))
    return ordered[rank - 1]


def distribution(samples: Sequence[float]) -> Distribution:
    if not samples:
        return Distribution(0, None, None, None, None)
    return Distribution(
        len(samples),
        sum(samples) / len(samples),
        percentile(samples, 0.50),
        percentile(samples, 0.95),
        max(samples),
    )


@dataclass(frozen=True, slots=True)
class Prices:
    """US dollars per million tokens; cached input defaults to the input price."""

    input_per_million: float
    output_per_million: float
    cached_input_per_million: float | None = None


@dataclass(frozen=True, slots=True)
class Usage:
    calls: int = 0
    prompt_tokens: int = 0
    cached_tokens: int = 0
    completion_tokens: int = 0

    def __add__(self, other: Usage) -> Usage:
        return Usage(
            self.calls + other.calls,
            self.prompt_tokens + other.prompt_tokens,
            self.cached_tokens + other.cached_tokens,
            self.completion_tokens + other.completion_tokens,
        )


def cost(usage: Usage, prices: Prices | None) -> float | None:
    """Dollars for ``usage``; None without prices. Cached tokens are part of the prompt tokens
    (as the OpenAI API counts them) and are billed at the cached price."""
    if prices is None:
        return None
    cached_price = (
        prices.cached_input_per_million
        if prices.cached_input_per_million is not None
        else prices.input_per_million
    )
    fresh = max(0, usage.prompt_tokens - usage.cached_tokens)
    return (
        fresh * prices.input_per_million
        + usage.cached_tokens * cached_price
        + usage.completion_tokens * prices.output_per_million
    ) / 1_000_000
