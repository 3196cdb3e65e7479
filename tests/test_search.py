"""Relevance-ranked search and relevant recall, in English and Chinese (storage/search.py,
prompts/injection.py with a query, MemoryInjector.block(..., query=...), `memq facts search`)."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st
from rank_bm25 import BM25Plus

from memq.cli import main
from memq.core.settings import MemqSettings
from producer.injector import MemoryInjector
from prompts.injection import FRAME_LINE, format_memory_for_injection
from storage import get_storage
from storage.document import Fact, MemoryDocument
from storage.management import MemoryManager
from storage.named_times import named_days
from storage.search import rank_by_relevance, rank_scored, score_facts, search_facts
from storage.words import tokenize

FACTS = [
    Fact(id="f_uv", content="Prefers uv over pip for Python projects", confidence=0.8,
         category="preference"),
    Fact(id="f_go", content="Works at Acme on the billing service, written in Go",
         confidence=0.95, category="context"),
    Fact(id="f_uvicorn", content="Deploys ASGI apps with uvicorn", confidence=0.7,
         category="knowledge"),
    Fact(id="f_zh_uv", content="用户喜欢使用 uv 管理 Python 项目", confidence=0.85,
         category="preference"),
    Fact(id="f_zh_job", content="用户在杭州工作，是后端工程师", confidence=0.9, category="context"),
    Fact(id="f_fix", content="Run the app with make dev", confidence=0.95, category="correction",
         source_error="suggested npm start"),
]  # fmt: skip


def ids(facts: list[Fact]) -> list[str]:
    return [f.id for f in facts]


def test_words_not_substrings() -> None:
    # "uv" is a word of the uv facts, not of "uvicorn" (the substring search matched both).
    assert ids(search_facts(FACTS, "uv")) == ["f_zh_uv", "f_uv"]
    assert ids(search_facts(FACTS, "uvicorn")) == ["f_uvicorn"]


def test_plural_and_case_fold() -> None:
    # "projects" and "project" are one word; "项目" is not the English word.
    assert ids(search_facts(FACTS, "PYTHON project")) == ["f_uv", "f_zh_uv"]
    assert ids(search_facts(FACTS, "prefer")) == ["f_uv"]


def test_chinese_is_segmented_into_words() -> None:
    assert "杭州" in tokenize("用户在杭州工作")
    assert ids(search_facts(FACTS, "杭州")) == ["f_zh_job"]
    assert ids(search_facts(FACTS, "后端工程师在哪里工作")) == ["f_zh_job"]
    assert ids(search_facts(FACTS, "管理项目")) == ["f_zh_uv"]


def test_more_shared_words_rank_higher() -> None:
    assert ids(search_facts(FACTS, "billing service Go"))[0] == "f_go"
    # Same words matched: the more confident fact first.
    assert ids(search_facts(FACTS, "uv python")) == ["f_zh_uv", "f_uv"]


def test_a_word_a_long_query_repeats_does_not_outweigh_the_one_it_names_once() -> None:
    """A conversation as the query (the update prompt's slice): "2" said six times by chance
    must not bury the fact the one rare word is about."""
    facts = [
        Fact(id=f"f{n}", content=f"Uses {n % 4 + 2}-space indents in project p{n}", confidence=0.9)
        for n in range(12)
    ]
    query = (
        "Session 2, turn 2: I bought item-2-2 and ride it 2 days a week. "
        "By the way, on p7 I use 3-space indents."
    )
    assert ids(search_facts(facts, query))[0] == "f7"
    assert rank_by_relevance(facts, query)[0].id == "f7"


def test_confidence_breaks_ties() -> None:
    twins = [
        Fact(id="low", content="likes tea", confidence=0.5),
        Fact(id="high", content="likes tea", confidence=0.9),
        Fact(id="mid", content="likes tea", confidence=0.7),
    ]
    assert ids(search_facts(twins, "tea")) == ["high", "mid", "low"]


def test_category_filters_before_the_cut() -> None:
    # Without the filter the top 1 is a context fact; with it, the best preference.
    assert ids(search_facts(FACTS, "uv python 杭州 工作", top_k=1)) == ["f_zh_job"]
    assert ids(search_facts(FACTS, "uv python 杭州 工作", top_k=1, category="preference")) == [
        "f_zh_uv"
    ]
    assert ids(search_facts(FACTS, "杭州", category="preference")) == []


@pytest.mark.parametrize("query, top_k", [("", 5), ("   ", 5), ("uv", 0), ("uv", -1), ("the", 5)])
def test_nothing_to_look_for_is_empty(query: str, top_k: int) -> None:
    assert search_facts(FACTS, query, top_k=top_k) == []


def test_no_shared_word_is_no_result() -> None:
    assert search_facts(FACTS, "kubernetes") == []


def test_relevance_blended_with_confidence() -> None:
    ranked = ids(rank_by_relevance(FACTS, "uvicorn"))
    assert ranked[0] == "f_uvicorn"  # the least confident fact, but the relevant one
    # Without any shared word: confidence order, document order among equals.
    assert ids(rank_by_relevance(FACTS, "kubernetes")) == [
        "f_go", "f_fix", "f_zh_job", "f_zh_uv", "f_uv", "f_uvicorn"
    ]  # fmt: skip


def count_chars(text: str) -> int:
    return len(text)


def test_recall_with_a_query_puts_the_relevant_fact_in_a_tight_budget() -> None:
    document = MemoryDocument(facts=list(FACTS))
    budget = 60 + len(FRAME_LINE) + 1  # room for the frame line, then 60 for the facts
    without = format_memory_for_injection(
        document, budget, count_tokens=count_chars, guaranteed_categories=()
    )
    with_query = format_memory_for_injection(
        document, budget, count_tokens=count_chars, guaranteed_categories=(), query="uvicorn"
    )
    assert "uvicorn" not in without
    assert "uvicorn" in with_query


def test_recall_keeps_guaranteed_categories_first() -> None:
    document = MemoryDocument(facts=list(FACTS))
    text = format_memory_for_injection(document, count_tokens=count_chars, query="杭州 工作")
    lines = text.split("Facts:\n")[1].splitlines()
    assert lines[0].startswith("- [correction")
    assert "杭州" in lines[1]


def test_without_a_query_recall_is_todays_behaviour() -> None:
    document = MemoryDocument(facts=list(FACTS))
    for blank in (None, "", "  "):
        assert format_memory_for_injection(
            document, 80, count_tokens=count_chars, query=blank
        ) == format_memory_for_injection(document, 80, count_tokens=count_chars)


@pytest.mark.parametrize("storage", ["file", "redis"])
def test_injector_and_management_search_on_both_backends(make_settings: Any, storage: str) -> None:
    settings: MemqSettings = make_settings(
        storage=storage, token_counting=False, injected_memory_max_tokens=68,  # 50 + the frame line
        guaranteed_categories="",
    )  # fmt: skip
    store = get_storage(settings)
    store.save("alice", "coder", MemoryDocument(facts=list(FACTS)))
    manager = MemoryManager(store)
    assert ids(manager.search("alice", "杭州", agent_name="coder")) == ["f_zh_job"]
    assert ids(manager.search("alice", "uv", agent_name="coder", limit=1)) == ["f_zh_uv"]
    injector = MemoryInjector(settings, store)
    assert "uvicorn" not in injector.block("alice", "coder")
    assert "uvicorn" in injector.block("alice", "coder", query="how do I run uvicorn?")


def test_cli_facts_search_ranks(make_settings: Any, capsys: pytest.CaptureFixture[str]) -> None:
    settings: MemqSettings = make_settings()
    get_storage(settings).save("bob", None, MemoryDocument(facts=list(FACTS)))
    env = {
        "MEMQ_STORAGE": settings.storage,
        "MEMQ_STORAGE_DIR": str(settings.storage_dir),
        "MEMQ_REDIS_URL": settings.redis_url,
        "MEMQ_KEY_PREFIX": settings.key_prefix,
    }
    with pytest.MonkeyPatch.context() as patch:
        for name, value in env.items():
            patch.setenv(name, value)
        assert main(["facts", "search", "bob", "杭州"]) == 0
        out = capsys.readouterr().out
        assert "f_zh_job" in out and "f_uv" not in out
        assert main(["facts", "search", "bob", "kubernetes"]) == 1
        assert "no fact of user bob matches" in capsys.readouterr().out


# --- the ranking's speed-ups compute what the plain computation did, float for float ----------

_WORDS = [
    "uv",
    "pip",
    "python",
    "go",
    "billing",
    "tea",
    "coffee",
    "deploys",
    "用户",
    "喜欢",
    "杭州",
]
_FACT_TEXT = st.lists(st.sampled_from([*_WORDS, "the", "and", "Tea", "teas"]), max_size=8).map(
    " ".join
)


def _plain_scores(facts: list[Fact], query: str) -> list[float]:
    """BM25+ through rank_bm25's own get_scores, 0 for a fact sharing no word (the scoring
    before the postings)."""
    words = tokenize(query)
    corpus = [tokenize(fact.content) for fact in facts]
    wanted = set(words)
    if not facts or not words or not any(wanted.intersection(c) for c in corpus):
        return [0.0] * len(facts)
    raw = BM25Plus([list(c) or [""] for c in corpus], b=0.0).get_scores(list(dict.fromkeys(words)))
    return [float(r) if wanted.intersection(c) else 0.0 for r, c in zip(raw, corpus, strict=True)]


def _plain_rank(facts: list[Fact], query: str, weight: float) -> list[tuple[Fact, float]]:
    """The blend sorted per fact in Python (the ranking before it was vectorised), with each
    fact's blended value."""
    scored = score_facts(facts, query)
    worst = min((s.score for s in scored), default=0.0)
    best = max((s.score for s in scored), default=0.0) - min(worst, 0.0)

    def value(s: Any) -> float:
        relevance = (s.score - min(worst, 0.0)) / best if best > 0 else 0.0
        return float(weight * relevance + (1.0 - weight) * s.fact.confidence)

    def blended(item: tuple[int, Any]) -> tuple[float, float, int]:
        index, s = item
        return (-value(s), -s.fact.confidence, index)

    return [(s.fact, value(s)) for _, s in sorted(enumerate(scored), key=blended)]


@given(
    texts=st.lists(_FACT_TEXT, max_size=40),
    confidences=st.lists(st.sampled_from([0.5, 0.7, 0.7, 0.9, 1.0]), min_size=40, max_size=40),
    query=_FACT_TEXT,
    weight=st.sampled_from([0.0, 0.3, 0.7, 1.0]),
)
def test_the_ranking_gives_the_plain_computations_scores_and_order(
    texts: list[str], confidences: list[float], query: str, weight: float
) -> None:
    facts = [
        Fact(id=f"f{i}", content=text or "x", confidence=confidence)
        for i, (text, confidence) in enumerate(zip(texts, confidences, strict=False))
    ]
    assert [s.score for s in score_facts(facts, query)] == _plain_scores(facts, query)
    plain = _plain_rank(facts, query, weight)
    assert ids(rank_by_relevance(facts, query, relevance_weight=weight)) == ids(
        [fact for fact, _ in plain]
    )
    ranked = rank_scored(facts, query, weight)
    assert [(f.id, v) for f, v in ranked] == [(f.id, v) for f, v in plain]


@pytest.mark.parametrize(
    ("query", "days"),
    [
        ("What did Gina find for her store on 1 February, 2023?", ("2023-02-01", "2023-02-01")),
        ("What event is Maria getting ready for on May 25, 2023?", ("2023-05-25", "2023-05-25")),
        ("what happened on the 3rd of March 2024", ("2024-03-03", "2024-03-03")),
        ("what did I do on 2023-05-08?", ("2023-05-08", "2023-05-08")),
        ("What workout class did Maria start in December 2023?", ("2023-12-01", "2023-12-31")),
        ("anything from Sept. 2022?", ("2022-09-01", "2022-09-30")),
        ("what did I plan in February, 2024", ("2024-02-01", "2024-02-29")),
        ("what happened on 31 April, 2023", ("2023-04-01", "2023-04-30")),  # no such day: its month
        ("How many times has Melanie gone to the beach in 2023?", ("2023-01-01", "2023-12-31")),
        ("我2023年5月8日做了什么", ("2023-05-08", "2023-05-08")),
        ("用户在２０２３年５月去了哪里", ("2023-05-01", "2023-05-31")),
        # The most precise time named wins: the day inside "May 2023"'s sentence.
        ("In May 2023, what did she do on May 8, 2023?", ("2023-05-08", "2023-05-08")),
    ],
)
def test_the_days_a_question_names_are_read(query: str, days: tuple[str, str]) -> None:
    found = named_days(query)
    assert found is not None
    assert (found[0].isoformat(), found[1].isoformat()) == days


@pytest.mark.parametrize(
    "query",
    [
        "May I ask what she likes?",  # "May" the verb
        "When did Melanie go camping in June?",  # a month without its year: which June?
        "What are the 3 things she bought for 2000 dollars?",  # numbers, not a time
        "what did I do on 2023-02-30",  # no such day
        "what did I do last weekend",  # relative: needs a "now" the ranking does not have
        "event 12023-05-08 logged",  # digits around a date are not a date
        "",
        "9" * 10_000 + " May 2023",  # long input: read in one linear pass, still found
    ],
)
def test_what_names_no_time_is_no_window(query: str) -> None:
    found = named_days(query)
    if query.endswith("May 2023"):
        assert found is not None and found[0].isoformat() == "2023-05-01"
    else:
        assert found is None
