"""P9: fact search and relevant recall over a 200-fact memory (English and Chinese facts).

Search: ``storage.search.search_facts`` (BM25+ over jieba-segmented words, cached per fact text),
measured per query over a rotating set of English and Chinese queries; baseline: DeerFlow's
substring search over the same facts. Recall: ``format_memory_for_injection`` with a query into a
2,000-token budget (tiktoken); baseline: the same call without a query (today's injection).
"""

from __future__ import annotations

import os
import time

from bench.common import BenchEnv, Result, fmt_ms, percentile
from bench.p7_injection import memory_with_facts
from prompts.injection import format_memory_for_injection
from prompts.tokens import make_token_counter
from storage.document import Fact, MemoryDocument
from storage.search import search_facts

CHINESE = (
    "用户在杭州的后端团队工作",
    "喜欢使用 uv 管理 Python 项目",
    "正在学习 Rust 的所有权和生命周期",
    "文档用英式英语书写",
)
QUERIES = (
    "how do I deploy billing on kubernetes?",
    "python package manager",
    "Rust lifetimes",
    "杭州 后端",
    "用 uv 管理项目",
    "which time zone is the user in",
)


def bilingual_memory(count: int = 200) -> MemoryDocument:
    document = memory_with_facts(count)
    for index, fact in enumerate(document.facts):
        if index % 4 == 0:  # a quarter of the facts in Chinese
            document.facts[index] = fact.model_copy(
                update={"content": f"{CHINESE[index % len(CHINESE)]}（记录 {index}）"}
            )
    return document


def substring(facts: list[Fact], query: str, top_k: int = 10) -> list[Fact]:
    needle = query.strip().casefold()
    matched = [f for f in facts if needle in f.content.casefold()]
    return sorted(matched, key=lambda f: -f.confidence)[:top_k]


def run(env: BenchEnv) -> Result:
    memory = bilingual_memory()
    facts = memory.facts
    count = make_token_counter(True)
    rounds = 300 if env.quick else 2000
    for query in QUERIES:  # warm-up: segmenter dictionary, per-fact word cache
        search_facts(facts, query)
        format_memory_for_injection(memory, 2000, count_tokens=count, query=query)
    searches: list[float] = []
    search_cpu: list[float] = []
    base: list[float] = []
    recall: list[float] = []
    plain: list[float] = []
    hits = 0
    for i in range(rounds):
        query = QUERIES[i % len(QUERIES)]
        t0, c0 = time.perf_counter(), time.thread_time()
        hits += len(search_facts(facts, query))
        searches.append(time.perf_counter() - t0)
        search_cpu.append(time.thread_time() - c0)
        t0 = time.perf_counter()
        substring(facts, query)
        base.append(time.perf_counter() - t0)
        if i % 4 == 0:
            t0 = time.perf_counter()
            format_memory_for_injection(memory, 2000, count_tokens=count, query=query)
            recall.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            format_memory_for_injection(memory, 2000, count_tokens=count)
            plain.append(time.perf_counter() - t0)
    p99 = percentile(searches, 99)
    cpu_p99 = percentile(search_cpu, 99)
    recall_median, plain_median = percentile(recall, 50), percentile(plain, 50)
    return Result(
        key="P9",
        title="search and recall with a query, 200 facts (EN + ZH)",
        measured=f"search p50 {fmt_ms(percentile(searches, 50))}, p99 {fmt_ms(p99)}; "
        f"recall with query median {fmt_ms(recall_median)}, "
        f"p99 {fmt_ms(percentile(recall, 99))}",
        baseline=f"substring search p50 {fmt_ms(percentile(base, 50))}; recall without query "
        f"median {fmt_ms(plain_median)} (ratio {recall_median / plain_median:.1f}x)",
        goal="search p99 <= 2 ms",
        met=p99 <= 0.002,
        details=[
            f"{rounds} searches over {len(QUERIES)} queries, {hits / rounds:.1f} hits per query",
            f"search CPU time (thread_time, excludes waiting for a core) p50 "
            f"{fmt_ms(percentile(search_cpu, 50))}, p99 {fmt_ms(cpu_p99)}; load average "
            f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} cores during the run",
            "recall = format_memory_for_injection(..., query=...) into 2,000 tokens (tiktoken)",
        ],
    )
