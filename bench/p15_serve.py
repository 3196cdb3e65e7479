"""SERVE: `memq serve` over HTTP and MCP, each against a baseline measured in the same run.

- HTTP hand-off: 16 concurrent keep-alive clients POST a 2 KB conversation to a real
  `memq serve` (uvicorn, API key, guard, validation, the producer's one EVALSHA), against a bare
  FastAPI endpoint on the same uvicorn settings making the same EVALSHA of `enqueue.lua`
  (bench/serve_bare.py). Blocks alternate between the two, so a noisy machine slows both alike.
- MCP recall: the `recall` tool over streamable HTTP with the SDK's client on a user with 200
  facts, against `POST /v1/users/{user}/context` (the same block) over plain HTTP.
"""

from __future__ import annotations

import http.client
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import anyio
import httpx

from bench.common import BenchEnv, Result, fmt_ms, percentile
from bench.p1_producer import conversation
from bench.p7_injection import memory_with_facts
from memq.core.settings import MemqSettings
from memq.local.redis_server import free_port
from memq.server.auth import digest
from memq.testing.celery_procs import REPO_ROOT, memq_env
from memq.testing.serve_proc import ServeProcess
from memq.testing.waiting import wait_for
from storage import get_storage

CLIENTS = 16
KEY = "memq_bench_agent_key_0123456789abcdef"
UVICORN_ARGS = ("--no-access-log", "--log-level", "warning", "--no-server-header")


def _keys_file(work: Path) -> Path:
    path = work / "keys.json"
    entry = {"name": "bench", "sha256": digest(KEY), "scopes": ["agent"]}
    path.write_text(json.dumps({"keys": [entry]}), encoding="utf-8")
    return path


class BareServer:
    """bench/serve_bare.py under uvicorn, started like `memq serve`."""

    def __init__(self, env: dict[str, str], log: Path) -> None:
        self.port = free_port()
        full = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
        full.update(env)
        self._log = log.open("ab")
        self.process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "uvicorn",
                "--factory",
                "bench.serve_bare:create_app",
                "--host",
                "127.0.0.1",
                "--port",
                str(self.port),
                *UVICORN_ARGS,
            ],
            cwd=REPO_ROOT,
            env=full,
            stdout=self._log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        wait_for(self._ready, timeout=30, interval=0.05, what="the bare FastAPI server")

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _ready(self) -> bool:
        if self.process.poll() is not None:
            raise RuntimeError(f"bare server exited {self.process.returncode}")
        try:
            return httpx.get(self.url + "/healthz", timeout=1).status_code == 200
        except httpx.HTTPError:
            return False

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        self._log.close()


def _load(port: int, bodies: list[bytes], per_client: int) -> tuple[list[float], float]:
    """``CLIENTS`` threads, each on its own keep-alive connection, ``per_client`` requests."""
    latencies: list[list[float]] = [[] for _ in range(CLIENTS)]
    errors: list[str] = []
    barrier = threading.Barrier(CLIENTS + 1)
    headers = {"Content-Type": "application/json", "Authorization": f"Bearer {KEY}"}

    def client(index: int) -> None:
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
        mine = latencies[index]
        barrier.wait()
        for i in range(per_client):
            body = bodies[(index * per_client + i) % len(bodies)]
            t0 = time.perf_counter()
            conn.request("POST", f"/v1/users/bench-{index}/conversations", body, headers)
            response = conn.getresponse()
            response.read()
            mine.append(time.perf_counter() - t0)
            if response.status != 202:
                errors.append(str(response.status))
        conn.close()

    threads = [threading.Thread(target=client, args=(i,)) for i in range(CLIENTS)]
    for thread in threads:
        thread.start()
    barrier.wait()
    started = time.perf_counter()
    for thread in threads:
        thread.join()
    elapsed = time.perf_counter() - started
    if errors:
        raise RuntimeError(f"{len(errors)} hand-offs not accepted: {sorted(set(errors))}")
    return [x for lane in latencies for x in lane], elapsed


def _hand_off(env: BenchEnv, settings: MemqSettings, keys_file: Path) -> dict[str, Any]:
    messages = conversation()
    bodies = [
        json.dumps({"thread_id": f"thread-{i}", "messages": messages}).encode() for i in range(200)
    ]
    child_env = memq_env(settings, MEMQ_SERVE_API_KEYS_FILE=str(keys_file))
    memq = ServeProcess(child_env, env.work_dir / "serve-bench.log").start()
    bare = BareServer(child_env, env.work_dir / "bare-bench.log")
    rounds = 3 if env.quick else 8
    per_client = 40 if env.quick else 100
    memq_lat: list[float] = []
    bare_lat: list[float] = []
    memq_time = bare_time = 0.0
    try:
        _load(memq.port, bodies, 10), _load(bare.port, bodies, 10)  # warm up
        for index in range(rounds):
            order = [(memq.port, True), (bare.port, False)]
            for port, is_memq in order if index % 2 else reversed(order):
                lat, elapsed = _load(port, bodies, per_client)
                if is_memq:
                    memq_lat += lat
                    memq_time += elapsed
                else:
                    bare_lat += lat
                    bare_time += elapsed
    finally:
        memq.stop()
        bare.stop()
    return {
        "memq_rate": len(memq_lat) / memq_time,
        "bare_rate": len(bare_lat) / bare_time,
        "memq_p50": percentile(memq_lat, 50),
        "memq_p99": percentile(memq_lat, 99),
        "bare_p50": percentile(bare_lat, 50),
        "bare_p99": percentile(bare_lat, 99),
        "requests": len(memq_lat),
        "size": len(bodies[0]),
    }


def _recall(env: BenchEnv, settings: MemqSettings, keys_file: Path) -> dict[str, Any]:
    from mcp import ClientSession
    from mcp.client.streamable_http import streamable_http_client

    user = "bench-mcp"
    get_storage(settings).save(user, None, memory_with_facts(200))
    query = "Which programming language and editor do I use at work?"
    calls = 50 if env.quick else 200
    child_env = memq_env(settings, MEMQ_SERVE_API_KEYS_FILE=str(keys_file))
    server = ServeProcess(child_env, env.work_dir / "serve-mcp.log").start()
    auth = {"Authorization": f"Bearer {KEY}"}
    mcp_lat: list[float] = []
    http_lat: list[float] = []

    async def mcp_calls() -> int:
        import httpx2

        headers = {**auth, "X-Memq-User": user}
        async with (
            httpx2.AsyncClient(headers=headers, timeout=30) as client,
            streamable_http_client(server.url + "/mcp", http_client=client) as (read, write),
            ClientSession(read, write) as session,
        ):
            await session.initialize()
            size = 0
            for index in range(calls + 5):
                t0 = time.perf_counter()
                result = await session.call_tool("recall", {"query": query})
                if index >= 5:  # the first calls warm the token counter and the pool
                    mcp_lat.append(time.perf_counter() - t0)
                size = len(result.content[0].text)  # type: ignore[union-attr]
            return size

    try:
        block_chars = anyio.run(mcp_calls)
        with httpx.Client(base_url=server.url, headers=auth, timeout=30) as client:
            for index in range(calls + 5):
                t0 = time.perf_counter()
                answer = client.post(f"/v1/users/{user}/context", json={"query": query})
                if index >= 5:
                    http_lat.append(time.perf_counter() - t0)
                answer.raise_for_status()
    finally:
        server.stop()
    return {
        "mcp_p50": percentile(mcp_lat, 50),
        "mcp_p99": percentile(mcp_lat, 99),
        "http_p50": percentile(http_lat, 50),
        "http_p99": percentile(http_lat, 99),
        "calls": calls,
        "block_chars": block_chars,
    }


def run(env: BenchEnv) -> Result:
    settings = env.settings(debounce_seconds=30, producer_timeout_seconds=1.0)
    keys_file = _keys_file(env.work_dir)
    h = _hand_off(env, settings, keys_file)
    r = _recall(env, env.settings(), keys_file)
    ratio = h["memq_rate"] / h["bare_rate"]
    return Result(
        key="SERVE",
        title=f"memq serve: HTTP hand-off at {CLIENTS} clients; MCP recall at 200 facts",
        measured=(
            f"hand-off p50 {fmt_ms(h['memq_p50'])}, p99 {fmt_ms(h['memq_p99'])}, "
            f"{h['memq_rate']:,.0f} req/s; MCP recall p50 {fmt_ms(r['mcp_p50'])}, "
            f"p99 {fmt_ms(r['mcp_p99'])}"
        ),
        baseline=(
            f"bare FastAPI + one EVALSHA {h['bare_rate']:,.0f} req/s "
            f"(p99 {fmt_ms(h['bare_p99'])}); ratio {ratio:.0%}; HTTP /context p99 "
            f"{fmt_ms(r['http_p99'])}"
        ),
        goal=">= 70 % of the bare endpoint's req/s",
        met=ratio >= 0.70,
        details=[
            f"{h['requests']} hand-offs each side ({h['size']} byte bodies), {CLIENTS} "
            "keep-alive clients in one process, blocks alternating between the two servers",
            f"bare p50 {fmt_ms(h['bare_p50'])}",
            f"MCP recall: {r['calls']} sequential `recall` calls (SDK client, streamable HTTP, "
            f"stateless JSON), block of {r['block_chars']} chars; the same block over "
            f"POST /context p50 {fmt_ms(r['http_p50'])}, p99 {fmt_ms(r['http_p99'])}",
        ],
    )
