"""The words of a text, as recall ranks and provenance matches them: one vocabulary of words for
English and Chinese, so a fact, a query and a cited message are cut alike.

DeerFlow searched memory by substring (``"uv"`` matched "uvicorn", ``"用 uv"`` matched nothing
when the fact said "使用 uv"). Here a text is NFKC-normalised and lower-cased, then cut into
runs: Latin-script runs by a regular expression (a few English stop words dropped, each ASCII word
reduced to its Snowball stem: "attended"/"attending" → "attend", which lifts BM25's
evidence-in-the-top-5 on LoCoMo from 66.6 % to 69.5 %, docs/benchmarks.md, RECALL), and
Chinese/Japanese runs by jieba's search-mode segmenter, which also yields the shorter words inside
a long one. Segmenting a fact costs ~40 µs, so the words of each text are memoised
(:func:`tokenize`, a bounded LRU); :func:`words` is the uncached cut for long texts read once.
"""

from __future__ import annotations

import functools
import logging
import re
import unicodedata
from typing import Any

_CJK = "\u3040-\u30ff\u3400-\u4dbf\u4e00-\u9fff\uf900-\ufaff"
_RUNS = re.compile(rf"[{_CJK}]+|[^\W_{_CJK}]+")
_CJK_RUN = re.compile(rf"[{_CJK}]")
# Words that carry no information about a user in either language; BM25's IDF alone does not
# discount them when a memory holds only a few facts.
_STOP_TEXT = (
    "a an and are as at be but by do does for from has have i in is it its me my of on or our "
    "she he so that the their them they this to was we were what when where which who why will "
    "with you your user users 的 了 是 在 和 也 都 就 我 你 他 她 它 吗 呢 吧 啊 用户"
)
_STOP_WORDS = frozenset(_STOP_TEXT.split())
# Distinct texts whose words are kept (fact contents and queries come back again and again).
TOKEN_CACHE_SIZE = 20_000


@functools.cache
def _stemmer() -> Any:
    import snowballstemmer

    return snowballstemmer.stemmer("english")


def _fold(word: str) -> str:
    # ASCII words only: the English stemmer would mangle other Latin-script languages' words
    # less than it helps, and digits/ids stay as they are.
    if word.isascii() and word.isalpha():
        return str(_stemmer().stemWord(word))
    return word


@functools.cache
def _segmenter() -> object:
    """jieba's default tokenizer, imported on first Chinese text (its dictionary takes ~0.5 s
    to load, from the package itself: nothing is downloaded)."""
    import jieba

    jieba.setLogLevel(logging.WARNING)
    return jieba


@functools.lru_cache(maxsize=TOKEN_CACHE_SIZE)
def tokenize(text: str) -> tuple[str, ...]:
    """:func:`words`, cached: fact contents and queries come back again and again."""
    return words(text)


def words(text: str) -> tuple[str, ...]:
    """The words of ``text`` for ranking: lower-cased, NFKC-normalised (full-width Latin becomes
    ASCII), stop words dropped. Chinese runs are segmented by jieba in search mode. Not cached:
    for long texts read once (a run's messages), which the cache would keep alive."""
    normalised = unicodedata.normalize("NFKC", text).casefold()
    found: list[str] = []
    for run in _RUNS.findall(normalised):
        if _CJK_RUN.match(run):
            jieba = _segmenter()
            pieces = jieba.lcut_for_search(run)  # type: ignore[attr-defined]
            found.extend(p for p in pieces if p.strip() and p not in _STOP_WORDS)
        elif run not in _STOP_WORDS:
            found.append(_fold(run))
    return tuple(found)


def warm() -> None:
    """Load the Chinese dictionary now rather than on the first Chinese query."""
    tokenize("预热中文分词")
