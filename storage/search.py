"""Relevance ranking of facts: BM25 over English and Chinese words, fused with the meaning of the
query when an embedding model is configured; confidence breaks ties. Every recall ranks here.

A query and each fact are cut into words (storage/words.py: English stems and Chinese words
alike) and ranked with BM25+ (``rank_bm25.BM25Plus``, without length normalisation; the Okapi
variant's IDF turns negative when a word is in more than half of a handful of facts, which is
most memories). Only facts sharing at least one word with the query are results; equal scores
are ordered by confidence, then by document order.

By meaning (:class:`Meaning`: the query's embedding and the memory's vectors of the same model,
storage/vectors.py), the two signals are fused per query: each fact's similarity by meaning and
its BM25 score are turned into z-scores over the facts being ranked (so neither scale matters —
BM25 grows with the query's length and the memory's size, cosines crowd into a narrow band that
differs by model), and added with equal weight (:data:`LEXICAL_WEIGHT`). The similarity by meaning
is not the raw cosine but one measured in the memory's own space: the query and the facts are
centred on the mean of the memory's vectors before the cosine (every fact of one user shares
that user's name, tone and topics, a common direction that makes facts alike without making them
relevant), and each fact loses :data:`HUB_PENALTY` × its hubness, its mean centred similarity to
its :data:`HUB_NEIGHBOURS` nearest fellow facts (a fact restated or close to many others is near
every query; CSLS-style hubness reduction). A third, smaller term is the conversation a fact was
learnt in (its ``source_thread_id``): BM25 of that thread's facts' words together, as a z-score over
the memory's threads, × :data:`THREAD_WEIGHT`. A fact often says what the question asks in other
words ("Joanna tried her newest dairy-free recipe" for "When did Joanna make a chocolate tart?"),
while a fact said beside it in the same conversation names the tart; with one thread, or facts
from none, the term is 0 and nothing changes. Last, when the question names a time explicitly —
a day, a month of a year or a year (:func:`storage.named_times.named_days`: "in August 2023", "on
1 February, 2023", "2023-05-08", "2023年5月") — each fact said then (:meth:`Fact.when_said`, from
:data:`DATE_DAYS_BEFORE` days before to :data:`DATE_DAYS_AFTER` after), or whose event date falls
then, gains :data:`DATE_WEIGHT`: so much that the facts of that time come first, in the fused
order, and the others follow ("What injury did Evan suffer in August 2023?": "Evan twisted his
knee last Friday", said in August, shares only the name). A question naming no time, or facts
that know none, rank as before. Measured on LoCoMo's 1,308 questions whose evidence is an
observation, evidence in the top 5: BM25 69.4 %, all-MiniLM-L6-v2 alone 73.1 %, reciprocal-rank
fusion 74.6 %, min-max blend 78.1 %, z-scores of the raw cosine and BM25 78.8 %, of the centred
cosine 80.0 %, with the hubness penalty 80.6 %, with the thread's words 81.7 % (weights chosen on
conversations 0-4: 82.3 %; 81.1 % on 5-9), with the time the question names 83.6 % (facts dated by
their session, as an extraction dates them; chosen on 0-4: 84.2 %; 83.2 % on 5-9). Every variant
tried is in docs/benchmarks.md. A fact without a vector of that model counts as average by
meaning, so a half-embedded memory still ranks by its words.

Building the index over 200 facts costs ~0.4 ms: the index of each distinct list of facts is
memoised (a bounded LRU), as are the words of each fact text (storage/words.py), so a repeated
search over an unchanged memory costs only the scoring.
"""

from __future__ import annotations

import functools
import heapq
import logging
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, Any, NamedTuple, Protocol

from storage.document import Fact
from storage.named_times import event_span, named_days
from storage.vectors import VectorSet, content_key, decode_vector
from storage.words import tokenize

if TYPE_CHECKING:
    from storage.vectors import Vector

log = logging.getLogger(__name__)

_INDEX_CACHE_SIZE = 64


class Scored(NamedTuple):
    """A fact and its relevance to the query (BM25 ``> 0``: they share at least one word).
    A named tuple: one is made per fact per ranking, and a tuple is the cheapest to make."""

    fact: Fact
    score: float


# BM25's weight beside meaning in the fused score (both as per-query z-scores); see above.
LEXICAL_WEIGHT = 1.0
# How much a fact's likeness to its nearest fellow facts (its hubness) is taken off its cosine,
# and over how many neighbours that likeness is averaged; see above.
HUB_PENALTY = 0.1
HUB_NEIGHBOURS = 5
# The weight, beside meaning and words, of the BM25 score of the conversation (thread) a fact was
# learnt in, all its facts' words together; see above.
THREAD_WEIGHT = 0.2
# The weight of a fact's being said (or its event's having happened) in the time the question
# names (:func:`storage.named_times.named_days`), widened by a week before and three days
# after; see above.
DATE_WEIGHT = 6.0
DATE_DAYS_BEFORE = 7
DATE_DAYS_AFTER = 3


@dataclass(frozen=True, slots=True)
class Meaning:
    """What ranking by meaning needs: the query's unit embedding and the memory's vectors of the
    same model (``None``: the memory has none yet)."""

    query: Vector
    vectors: VectorSet | None


class QueryEmbedding(Protocol):
    """Embeds a query at recall time, never raising: None means "rank by words" (no model, or the
    endpoint did not answer in time). ``producer.query_embedding.QueryEmbedder`` is the real one."""

    @property
    def model(self) -> str: ...

    def embed(self, text: str) -> Vector | None: ...


def meaning_for(
    embeddings: Mapping[str, VectorSet], model: str, query: Vector | None
) -> Meaning | None:
    """The :class:`Meaning` of a query embedded by ``model`` against a document's vectors; None
    without a query vector (no model configured, or the endpoint failed: words alone)."""
    if query is None:
        return None
    return Meaning(query, embeddings.get(model))


class _Index(NamedTuple):
    """BM25+ over one list of fact texts, with what every query needs precomputed: each word's
    postings (the facts holding it and how often) and the length-normalised ``k1`` per fact."""

    bm25: Any  # rank_bm25.BM25Plus: its idf, k1 and delta
    postings: dict[str, tuple[Any, Any]]  # word -> (fact positions, counts), numpy arrays
    k1_norm: Any  # k1 × (1 − b + b × length / average length), per fact

    def scores(self, words: Sequence[str]) -> Any:
        """``BM25Plus.get_scores(words)``, float for float: the same expression summed in the same
        order, but each word's counts scattered from its postings instead of looked up in every
        fact's dictionary (a Python loop over all facts per word), and a word in no fact skipped
        (its idf is 0, so it adds exactly 0)."""
        import numpy as np

        bm25 = self.bm25
        score = np.zeros(bm25.corpus_size)
        for word in words:
            posting = self.postings.get(word)
            if posting is None:
                continue
            q_freq = np.zeros(bm25.corpus_size, dtype=np.int64)
            q_freq[posting[0]] = posting[1]
            score += bm25.idf[word] * (
                bm25.delta + (q_freq * (bm25.k1 + 1)) / (self.k1_norm + q_freq)
            )
        return score


@functools.lru_cache(maxsize=_INDEX_CACHE_SIZE)
def _index(contents: tuple[str, ...]) -> _Index:
    """The BM25+ index per distinct list of fact texts: a memory is searched far more often than
    it changes."""
    return _build_index([list(tokenize(text)) or [""] for text in contents])


class _Threads(NamedTuple):
    """The conversations a memory's facts were learnt in, as documents for ranking: each
    fact's thread (its position in ``lexical``; -1 for a fact from no thread) and BM25+ over each
    thread's facts' words together."""

    of_fact: Any  # (facts,) intp
    lexical: _Index


@functools.lru_cache(maxsize=_INDEX_CACHE_SIZE)
def _threads(contents: tuple[str, ...], threads: tuple[str | None, ...]) -> _Threads | None:
    """The thread documents per distinct list of facts and threads; None when fewer than two
    threads hold facts (one thread says nothing about which facts are relevant)."""
    import numpy as np

    position: dict[str, int] = {}
    for thread in threads:
        if thread is not None:
            position.setdefault(thread, len(position))
    if len(position) < 2:
        return None
    words: list[list[str]] = [[] for _ in position]
    for text, thread in zip(contents, threads, strict=True):
        if thread is not None:
            words[position[thread]].extend(tokenize(text))
    of_fact = np.array([-1 if t is None else position[t] for t in threads], dtype=np.intp)
    return _Threads(of_fact, _build_index([w or [""] for w in words]))


def _build_index(corpus: list[list[str]]) -> _Index:
    import numpy as np
    from rank_bm25 import BM25Plus

    # b=0: no length normalisation. A fact is one sentence; being a few words longer says
    # nothing about relevance, so facts matching the same words tie and confidence decides.
    bm25 = BM25Plus(corpus, b=0.0)
    found: dict[str, tuple[list[int], list[int]]] = {}
    for position, frequencies in enumerate(bm25.doc_freqs):
        for word, count in frequencies.items():
            entry = found.setdefault(word, ([], []))
            entry[0].append(position)
            entry[1].append(count)
    postings = {
        word: (np.array(where, dtype=np.intp), np.array(counts, dtype=np.int64))
        for word, (where, counts) in found.items()
        if word  # the placeholder of a fact without words matches no query word
    }
    doc_len = np.array(bm25.doc_len)
    k1_norm = bm25.k1 * (1 - bm25.b + bm25.b * doc_len / bm25.avgdl)
    return _Index(bm25, postings, k1_norm)


def score_facts(facts: Sequence[Fact], query: str, meaning: Meaning | None = None) -> list[Scored]:
    """Every fact with its relevance to ``query``, in document order. By words alone a score is
    BM25 (0: no shared word); with ``meaning`` it is the fused z-score (any sign; see above)."""
    return _scores(facts, query, meaning)[0]


def _scores(
    facts: Sequence[Fact], query: str, meaning: Meaning | None
) -> tuple[list[Scored], bool]:
    """The scores, and whether meaning took part (the memory had vectors of the query's model)."""
    lexical = _bm25(facts, query)
    fused = _fused(lexical, query, meaning) if meaning is not None and facts else None
    return (lexical, False) if fused is None else (fused, True)


def _fused(lexical: list[Scored], query: str, meaning: Meaning) -> list[Scored] | None:
    import numpy as np

    vector_set = meaning.vectors
    if vector_set is None or vector_set.dimensions != meaning.query.shape[0]:
        return None  # no vector of this model's size: words alone
    facts = [s.fact for s in lexical]
    stored = vector_set.vectors
    encoded = tuple(map(stored.get, _keys(tuple(f.content for f in facts))))
    space = _space(encoded, vector_set.dimensions)
    if not space.present:
        return None
    semantic = np.zeros(len(facts), dtype=np.float64)
    semantic[list(space.present)] = _z(space.similarity(meaning.query))
    words = _z(np.array([s.score for s in lexical], dtype=np.float64))
    fused = semantic + LEXICAL_WEIGHT * words + THREAD_WEIGHT * _thread_words(facts, query)
    fused += DATE_WEIGHT * _said_then(facts, query)
    return [Scored(fact, score) for fact, score in zip(facts, fused.tolist(), strict=True)]


def _thread_words(facts: Sequence[Fact], query: str) -> Any:
    """Each fact's thread's BM25 score as a z-score over the memory's threads (0 for a fact from
    no thread, or when the memory's facts come from fewer than two threads); see above."""
    import numpy as np

    nothing = np.zeros(len(facts), dtype=np.float64)
    threads = _threads(tuple(f.content for f in facts), tuple(f.source_thread_id for f in facts))
    words = list(dict.fromkeys(tokenize(query)))
    if threads is None or not words:
        return nothing
    by_thread = np.append(_z(_matched_scores(threads.lexical, words)), 0.0)
    return by_thread[threads.of_fact]  # -1 (no thread) reads the appended 0


def _said_then(facts: Sequence[Fact], query: str) -> Any:
    """1 for each fact said — or whose event happened — within the days the query names (from
    :data:`DATE_DAYS_BEFORE` before to :data:`DATE_DAYS_AFTER` after), else 0; all 0 when it
    names none. A fact that knows no time is outside."""
    import numpy as np

    inside = np.zeros(len(facts), dtype=np.float64)
    named = named_days(query)
    if named is None:
        return inside
    low = named[0] - timedelta(days=DATE_DAYS_BEFORE)
    high = named[1] + timedelta(days=DATE_DAYS_AFTER)
    for position, fact in enumerate(facts):
        said = fact.when_said()
        if said is not None and low <= said.date() <= high:
            inside[position] = 1.0
        elif fact.event_date is not None:
            first, last = event_span(fact.event_date)
            inside[position] = float(first <= high and last >= low)
    return inside


@functools.lru_cache(maxsize=_INDEX_CACHE_SIZE)
def _keys(contents: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(content_key(text) for text in contents)


class _Space(NamedTuple):
    """A memory's vectors made ready for ranking: centred on their mean and re-normalised, with
    each fact's hubness (its mean similarity to its nearest fellow facts; see above)."""

    centre: Any  # (dimensions,) float32: the mean of the memory's vectors
    centred: Any  # (facts with a vector, dimensions) float32, unit rows (0 where nothing is left)
    hubness: Any  # (facts with a vector,) float64
    present: tuple[int, ...]  # the positions of the facts that have a vector

    def similarity(self, query: Vector) -> Any:
        """Each fact's centred cosine with the centred query, less its hubness penalty."""
        import numpy as np

        shifted = query - self.centre
        norm = float(np.linalg.norm(shifted))
        if norm == 0.0:  # the query is the memory's average: meaning cannot tell facts apart
            return np.zeros(len(self.present), dtype=np.float64)
        cosines = (self.centred @ (shifted / norm)).astype(np.float64)
        return cosines - HUB_PENALTY * self.hubness


@functools.lru_cache(maxsize=_INDEX_CACHE_SIZE)
def _space(encoded: tuple[str | None, ...], dimensions: int) -> _Space:
    """The decoded vectors, centred, and their hubness, per distinct list of stored vectors: a
    memory is ranked far more often than it changes (300 facts: ~2 ms once, then cached)."""
    import numpy as np

    rows = [(i, decode_vector(text, dimensions)) for i, text in enumerate(encoded) if text]
    kept = [(i, v) for i, v in rows if v is not None]
    if not kept:
        empty = np.zeros((0, dimensions), dtype=np.float32)
        return _Space(np.zeros(dimensions, dtype=np.float32), empty, np.zeros(0), ())
    matrix = np.stack([v for _, v in kept])
    centre = matrix.mean(axis=0)
    centred = matrix - centre
    norms = np.linalg.norm(centred, axis=1, keepdims=True)
    centred = np.divide(centred, norms, out=np.zeros_like(centred), where=norms > 0)
    return _Space(centre, centred, _hubness(centred), tuple(i for i, _ in kept))


def _hubness(centred: Any) -> Any:
    """Each row's mean similarity to its :data:`HUB_NEIGHBOURS` most similar other rows."""
    import numpy as np

    count = centred.shape[0]
    neighbours = min(HUB_NEIGHBOURS, count - 1)
    if neighbours <= 0:
        return np.zeros(count, dtype=np.float64)
    similar = (centred @ centred.T).astype(np.float64)
    np.fill_diagonal(similar, -np.inf)
    nearest = np.partition(similar, count - neighbours, axis=1)[:, count - neighbours :]
    return nearest.mean(axis=1)


def _z(values: Any) -> Any:
    """Per-query z-scores; all equal → all 0 (the signal says nothing about this query)."""
    std = float(values.std())
    return (values - values.mean()) / std if std > 0 else values * 0.0


def _bm25(facts: Sequence[Fact], query: str) -> list[Scored]:
    query_words = tokenize(query)
    if not facts or not query_words:
        return [Scored(fact, 0.0) for fact in facts]
    index = _index(tuple(fact.content for fact in facts))
    # Each distinct word once: a long query (a conversation, for the update prompt's slice)
    # repeats common words by chance, and counted each time they would outweigh the one rare
    # word that names what the message is about.
    words = list(dict.fromkeys(query_words))
    scores = _matched_scores(index, words).tolist()
    return [Scored(fact, score) for fact, score in zip(facts, scores, strict=True)]


def _matched_scores(index: _Index, words: Sequence[str]) -> Any:
    """BM25+ of each document for ``words`` (distinct), 0 for a document sharing none."""
    import numpy as np

    size = index.bm25.corpus_size
    shared = [index.postings[word][0] for word in words if word in index.postings]
    if not shared:
        return np.zeros(size, dtype=np.float64)
    # BM25Plus gives every document a floor (delta) per query word; a document with no shared
    # word is not a match, so its score is set to 0 here rather than trusted.
    matched = np.zeros(size, dtype=bool)
    for where in shared:
        matched[where] = True
    return np.where(matched, index.scores(words), 0.0)


def search_facts(
    facts: Sequence[Fact],
    query: str,
    *,
    top_k: int = 10,
    category: str | None = None,
    meaning: Meaning | None = None,
) -> list[Fact]:
    """The ``top_k`` facts most relevant to ``query``; ``category`` filters before the cut.

    Empty query or ``top_k <= 0`` → ``[]``. By words alone only facts sharing a word are
    results; with ``meaning`` every fact is ranked (a fact can match by meaning alone). Ties:
    higher confidence first, then document order.
    """
    if top_k <= 0 or not query.strip():
        return []
    if category is not None:
        wanted = category.strip()
        facts = [f for f in facts if f.category == wanted]
    scored, by_meaning = _scores(facts, query, meaning)
    if not by_meaning:
        scored = [s for s in scored if s.score > 0.0]
    # The best top_k without sorting every fact: with meaning every fact is a candidate.
    ranked = heapq.nsmallest(
        top_k,
        enumerate(scored),
        key=lambda item: (-item[1].score, -item[1].fact.confidence, item[0]),
    )
    return [s.fact for _, s in ranked]


def rank_by_relevance(
    facts: Sequence[Fact],
    query: str,
    *,
    relevance_weight: float = 0.7,
    meaning: Meaning | None = None,
) -> list[Fact]:
    """All facts, best first, by ``relevance_weight × relevance + (1 − weight) × confidence``,
    relevance being the score (:func:`score_facts`) scaled to [0, 1] between the worst and the
    best. Without any shared word (and no ``meaning``) this is the confidence order."""
    return [fact for fact, _ in rank_scored(facts, query, relevance_weight, meaning)]


def rank_scored(
    facts: Sequence[Fact],
    query: str,
    relevance_weight: float = 0.7,
    meaning: Meaning | None = None,
) -> list[tuple[Fact, float]]:
    """:func:`rank_by_relevance`'s order with each fact's blended value, the score it was ranked
    by (in [0, 1]; what the inspector's preview shows beside a fact it left out)."""
    import numpy as np

    scored = score_facts(facts, query, meaning)
    if not scored:
        return []
    # Vectorised, float for float what a sort by (-value, -confidence, position) computes per
    # fact in Python: the same operations in the same order, and a stable total order.
    score = np.array([s.score for s in scored], dtype=np.float64)
    confidence = np.array([s.fact.confidence for s in scored], dtype=np.float64)
    floor = min(float(score.min()), 0.0)
    best = float(score.max()) - floor
    weight = min(1.0, max(0.0, relevance_weight))
    relevance = (score - floor) / best if best > 0 else np.zeros(len(scored))
    value = weight * relevance + (1.0 - weight) * confidence
    order = np.lexsort((np.arange(len(scored)), -confidence, -value))
    values = value.tolist()
    return [(scored[i].fact, values[i]) for i in order.tolist()]
