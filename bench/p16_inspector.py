"""INSPECTOR: the inspector's memory page over 200 facts and its queue page (50 dead letters),
served by a real `memq serve`; server time (its ``Server-Timing`` header) p50/p99 and the round
trip. Baselines, interleaved in the same run: the HTTP API's JSON of the same memory
(``GET /v1/users/{id}/memory``) and of the same queue figures and dead letters.

Then the memory page of a 1,000-fact user (one page of 50 facts: its bytes and server time,
against the API's JSON of that memory), and the first preview after a fresh `memq serve` starts
(the inspector warms the token counter and the Chinese segmenter at start; goal <= 100 ms)."""

from __future__ import annotations

import re
import time
from collections.abc import Callable

import httpx

from bench.common import BenchEnv, Result, percentile
from bench.p7_injection import memory_with_facts
from memq.server.auth import digest
from memq.testing.celery_procs import memq_env
from memq.testing.serve_proc import ServeProcess
from producer.producer import MemoryProducer
from storage import get_storage
from storage.management import MemoryManager
from worker.queue import QueueClient

KEY = "memq_bench_admin_key_0123456789abcdef"
USER = "bench-200"
BIG = "bench-1000"
GOAL_PAGE_BYTES = 60_000
GOAL_PAGE_SERVER_MS = 50.0
GOAL_FIRST_PREVIEW_MS = 100.0
DEAD = 50
# A page over 200 facts is one request costing a small multiple of the API's JSON of the same
# data (the same load, plus the HTML): round-trip p50 ratios, measured side by side.
GOAL_MEMORY_RATIO = 3.0
GOAL_QUEUE_RATIO = 2.0
_TIMING = re.compile(r"app;dur=([0-9.]+)")


def _seed(env: BenchEnv) -> tuple[ServeProcess, httpx.Client, httpx.Client]:
    settings = env.settings()
    manager = MemoryManager(get_storage(settings))
    manager.import_document(USER, memory_with_facts(200).to_json())
    manager.import_document(BIG, memory_with_facts(1000).to_json())
    turn = [{"role": "user", "content": "hi, I sail"}, {"role": "assistant", "content": "ok"}]
    with MemoryProducer(settings) as producer:
        for n in range(DEAD):
            producer.enqueue(f"thread-{n}", f"bench-u{n}", None, turn, flush=True)
    client = env.client()
    queue = QueueClient(settings, client)
    for claim in queue.claim(limit=DEAD * 2).claims:
        queue.fail(claim.context_id, claim.token, "LLM answer was not JSON", None)
    client.close()
    keys = env.work_dir / "inspector-keys.json"
    keys.write_text(f'[{{"name": "ops", "sha256": "{digest(KEY)}", "scopes": ["admin"]}}]')
    server = ServeProcess(
        memq_env(settings, MEMQ_SERVE_API_KEYS_FILE=str(keys)), env.work_dir / "inspector.log"
    ).start()
    return server, *_clients(server)


def _clients(server: ServeProcess) -> tuple[httpx.Client, httpx.Client]:
    ui = httpx.Client(base_url=server.url + "/ui", timeout=30, follow_redirects=True)
    form = ui.get("/login").text
    token = re.search(r'name="csrf_token" value="([^"]+)"', form)
    if token is None:
        raise RuntimeError("the login page has no CSRF field")
    ui.post("/login", data={"csrf_token": token.group(1), "key": KEY}).raise_for_status()
    api = httpx.Client(base_url=server.url, timeout=30, headers={"Authorization": f"Bearer {KEY}"})
    return ui, api


def _first_preview(env: BenchEnv) -> float:
    """Server time of the first preview (a Chinese query) of a `memq serve` just started."""
    settings = env.settings()
    keys = env.work_dir / "inspector-keys.json"
    server = ServeProcess(
        memq_env(settings, MEMQ_SERVE_API_KEYS_FILE=str(keys)), env.work_dir / "inspector-2.log"
    ).start()
    ui, api = _clients(server)
    try:
        form = ui.get(f"/users/{BIG}/preview").text
        token = re.search(r'name="csrf_token" value="([^"]+)"', form)
        assert token is not None
        data = {"csrf_token": token.group(1), "query": "杭州的工作 and sailing", "budget": "500"}
        took = _timed(lambda: ui.post(f"/users/{BIG}/preview", data=data))
        return took[1] if took[1] is not None else took[0]
    finally:
        ui.close()
        api.close()
        server.stop()


def _timed(get: Callable[[], httpx.Response]) -> tuple[float, float | None]:
    t0 = time.perf_counter()
    answer = get()
    took = time.perf_counter() - t0
    answer.raise_for_status()
    found = _TIMING.search(answer.headers.get("server-timing", ""))
    return took * 1000, float(found.group(1)) if found else None


def _p(samples: list[float]) -> str:
    return f"p50 {percentile(samples, 50):.1f} ms, p99 {percentile(samples, 99):.1f} ms"


def run(env: BenchEnv) -> Result:
    server, ui, api = _seed(env)
    rounds = 40 if env.quick else 200
    pages = {
        "memory": (
            lambda: ui.get(f"/users/{USER}/memory"),
            lambda: api.get(f"/v1/users/{USER}/memory"),
        ),
        "queue": (lambda: ui.get("/queue"), lambda: _queue_json(api)),
        "big": (
            lambda: ui.get(f"/users/{BIG}/memory"),
            lambda: api.get(f"/v1/users/{BIG}/memory"),
        ),
    }
    big_bytes = api_bytes = 0
    figures: dict[str, dict[str, list[float]]] = {}
    try:
        for name, (page, baseline) in pages.items():
            for _ in range(5):  # warm-up: templates compiled, connections open
                page(), baseline()
            server_ms: list[float] = []
            trip_ms: list[float] = []
            base_ms: list[float] = []
            for _ in range(rounds):
                took, server_took = _timed(page)
                trip_ms.append(took)
                if server_took is not None:
                    server_ms.append(server_took)
                base_ms.append(_timed(baseline)[0])
            figures[name] = {"server": server_ms, "trip": trip_ms, "base": base_ms}
        big_bytes = len(ui.get(f"/users/{BIG}/memory").content)
        api_bytes = len(api.get(f"/v1/users/{BIG}/memory").content)
    finally:
        ui.close()
        api.close()
        server.stop()
    first_ms = _first_preview(env)
    memory, queue, big = figures["memory"], figures["queue"], figures["big"]
    big_server = percentile(big["server"], 50)
    big_ratio = percentile(big["trip"], 50) / percentile(big["base"], 50)
    ratio = percentile(memory["trip"], 50) / percentile(memory["base"], 50)
    qratio = percentile(queue["trip"], 50) / percentile(queue["base"], 50)
    return Result(
        key="INSPECTOR",
        title="inspector pages: memory of 200 facts, queue with 50 dead letters (server time)",
        measured=(
            f"memory {_p(memory['server'])}; queue {_p(queue['server'])}; 1,000-fact memory "
            f"page {big_bytes / 1000:.1f} KB, server {_p(big['server'])}; first preview after "
            f"start {first_ms:.0f} ms"
        ),
        baseline=(
            f"JSON of the same data: memory round trip {ratio:.1f}x the API's "
            f"({percentile(memory['base'], 50):.1f} ms p50), queue {qratio:.1f}x "
            f"({percentile(queue['base'], 50):.1f} ms p50); 1,000-fact page {big_ratio:.1f}x "
            f"the API's JSON of that memory ({api_bytes / 1000:.0f} KB, "
            f"{percentile(big['base'], 50):.1f} ms p50)"
        ),
        goal=(
            f"one request per page; round trip p50 <= {GOAL_MEMORY_RATIO:.0f}x the API's JSON "
            f"(memory), <= {GOAL_QUEUE_RATIO:.0f}x (queue); 1,000-fact page <= "
            f"{GOAL_PAGE_BYTES // 1000} KB and <= {GOAL_PAGE_SERVER_MS:.0f} ms server p50; first "
            f"preview <= {GOAL_FIRST_PREVIEW_MS:.0f} ms"
        ),
        met=ratio <= GOAL_MEMORY_RATIO
        and qratio <= GOAL_QUEUE_RATIO
        and big_bytes <= GOAL_PAGE_BYTES
        and big_server <= GOAL_PAGE_SERVER_MS
        and first_ms <= GOAL_FIRST_PREVIEW_MS,
        details=[
            f"{rounds} requests per page over loopback, each followed by its baseline",
            f"memory page round trip {_p(memory['trip'])}; API JSON {_p(memory['base'])}",
            f"queue page round trip {_p(queue['trip'])}; API JSON {_p(queue['base'])}",
        ],
    )


def _queue_json(api: httpx.Client) -> httpx.Response:
    api.get("/v1/queue/stats").raise_for_status()
    return api.get("/v1/dead-letters")
