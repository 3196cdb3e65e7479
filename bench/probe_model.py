"""``python -m bench.probe_model`` (``make probe-model``): a real small model in the loop.

Starts the local model of ``../shared/tools/local-llm`` (llama-cpp-python's OpenAI-compatible
server over Qwen2.5-Coder-1.5B-Instruct; ``serve.sh``), or uses ``--base-url``, and hands it a
fixed set of conversations through the real stack — a private redis-server, a real Celery worker
and beat, the producer's flush, the real ``openai`` client — then prints per conversation what was
learnt, whether its obvious fact was, dead letters, retries, seconds per extraction and the
answer-shape counters. Optional and slow (minutes per conversation on 2 cores): never part of the
test run or CI. The table goes into docs/benchmarks.md, one per prompt version.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from memq.core.connection import redis_client
from memq.core.metrics import read_counts
from memq.core.settings import MemqSettings
from memq.local.redis_server import RedisServer
from prompts.update_prompt import PROMPT_VERSION

DEFAULT_LLM_DIR = Path(__file__).resolve().parents[2] / "shared" / "tools" / "local-llm"
SERVER_READY_SECONDS = 900.0  # the model loads in seconds, but the machine may be busy
EXTRACTION_SECONDS = 3600.0  # one conversation, retries included, on a loaded 2-core machine
# Answer-shape counters (memq.core.metrics.COUNTERS) the table shows for each conversation.
SHAPE_COUNTERS = (
    "answers_missing_fields",
    "facts_invalid",
    "removals_unknown",
    "facts_refused",
    "citations_repaired",
)


@dataclass(frozen=True)
class Conversation:
    """One probe case: its sessions (each one flush of the same thread's user), the words of
    which one must be in a learnt fact (its obvious fact), and words no fact may hold after."""

    name: str
    sessions: tuple[tuple[tuple[str, str], ...], ...]
    expect: tuple[str, ...]
    never: tuple[str, ...] = ()


def _session(*turns: tuple[str, str]) -> tuple[tuple[str, str], ...]:
    return turns


# A long coding session with one lasting fact in the middle of it.
_LONG_TURNS = (
    ("How do I read a TOML file in Python?", "Use tomllib.load on a file opened in 'rb'."),
    ("And write one?", "The standard library cannot; tomli_w can."),
    ("What is a good way to parse dates?", "datetime.fromisoformat handles ISO 8601."),
    ("How do I time a function?", "time.perf_counter before and after, or timeit."),
    ("Can you explain list comprehensions?", "[f(x) for x in items if keep(x)]."),
    ("Thanks. How do I run tests in parallel?", "pytest-xdist: pytest -n auto."),
    (
        "By the way, our CI runs on GitLab, not GitHub, so give me GitLab CI syntax.",
        "Understood: .gitlab-ci.yml with stages and jobs.",
    ),
    ("How do I cache pip downloads there?", "cache: paths: [.cache/pip] with PIP_CACHE_DIR."),
    ("What does a rules: block do?", "It decides when a job runs, like only/except."),
    ("How do I retry a flaky job?", "retry: 2 on the job."),
    ("OK. How do I format code?", "ruff format, or black."),
    ("Great, that's all for today.", "Good luck with the pipeline!"),
)
_LONG = tuple(
    message
    for question, answer in _LONG_TURNS
    for message in (("user", question), ("assistant", answer))
)

CONVERSATIONS: tuple[Conversation, ...] = (
    Conversation(
        "english introduction",
        (
            _session(
                (
                    "user",
                    "Hi! I'm Maria, a data engineer at Zalando in Berlin. I mostly write "
                    "Scala and Spark jobs. Can you help me speed up a join?",
                ),
                ("assistant", "Sure. Broadcast the smaller side if it fits in memory."),
            ),
        ),
        expect=("zalando", "scala", "spark", "data engineer"),
    ),
    Conversation(
        "chinese introduction",
        (
            _session(
                ("user", "你好，我叫李伟，在杭州做后端开发，主要用 Go。平时喜欢喝绿茶。"),
                ("assistant", "你好李伟！有什么可以帮你的？"),
            ),
        ),
        expect=("杭州", "后端", "hangzhou", "backend", "go"),
    ),
    Conversation(
        "correction",
        (
            _session(
                ("user", "Set up the frontend project for me."),
                ("assistant", "Run npm install, then npm run dev."),
                ("user", "No. We never use npm, always pnpm. Please remember that."),
                ("assistant", "Sorry: pnpm install, then pnpm dev."),
            ),
        ),
        expect=("pnpm",),
    ),
    Conversation(
        "contradiction",
        (
            _session(
                ("user", "I live in Munich and work remotely for a Dutch startup."),
                ("assistant", "Nice, Munich is lovely."),
            ),
            _session(
                ("user", "Update: I moved from Munich to Lisbon last month."),
                ("assistant", "Congratulations on the move to Lisbon!"),
            ),
        ),
        expect=("lisbon",),
    ),
    Conversation(
        "assistant-only claim",
        (
            _session(
                ("user", "I'm new to Rust, I come from Python. Which editor should I use?"),
                (
                    "assistant",
                    "Since you are a Neovim power user, install rust-analyzer for Neovim.",
                ),
                ("user", "ok"),
            ),
        ),
        expect=("python", "rust"),
        never=("neovim",),
    ),
    Conversation("long session", (_LONG,), expect=("gitlab",)),
)


@dataclass
class Outcome:
    name: str
    facts: list[str]
    learnt: bool
    clean: bool  # no fact holds a word of ``never``
    dead: int
    retries: int
    seconds: list[float] = field(default_factory=list)
    llm_seconds: float = 0.0
    calls: int = 0
    counters: dict[str, int] = field(default_factory=dict)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _answers(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/models", timeout=5) as reply:
            return int(reply.status) == 200
    except OSError:
        return False


@contextlib.contextmanager
def local_model(llm_dir: Path, model: str, log_path: Path) -> Iterator[str]:
    """``serve.sh MODEL PORT`` in its own session, until its /v1/models answers; stopped after
    (its whole process group, and only it)."""
    port = free_port()
    url = f"http://127.0.0.1:{port}/v1"
    # A context for the long session, and the usual priority (serve.sh's default, nice 19, starves
    # the model on a shared machine: the probe would measure the neighbours).
    env = {
        **os.environ,
        "N_CTX": os.environ.get("N_CTX", "8192"),
        "NICE": os.environ.get("NICE", "0"),
        "VERBOSE": "False",
    }
    with log_path.open("wb") as log:
        proc = subprocess.Popen(
            ["bash", str(llm_dir / "serve.sh"), model, str(port)],
            stdout=log,
            stderr=subprocess.STDOUT,
            env=env,
            start_new_session=True,
        )
        try:
            deadline = time.monotonic() + SERVER_READY_SECONDS
            while not _answers(url):
                if proc.poll() is not None:
                    raise RuntimeError(f"the model server exited ({proc.returncode}): {log_path}")
                if time.monotonic() > deadline:
                    raise RuntimeError(f"the model server did not answer in time: {log_path}")
                time.sleep(1.0)
            yield url
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()


def probe_settings(redis_url: str, base_url: str, work_dir: Path, **overrides: Any) -> MemqSettings:
    values: dict[str, Any] = {
        "redis_url": redis_url,
        "key_prefix": "probe",
        "storage_dir": work_dir / "memory",
        "data_dir": work_dir / "data",
        "llm_provider": "openai",
        "llm_base_url": base_url,
        "llm_api_key": "not-needed",
        "llm_model": "local",
        "llm_timeout_seconds": 1800.0,  # one call on a loaded 2-core machine
        "llm_max_retries": 0,
        "max_attempts": 2,  # a second attempt is what the probe counts; a third would not help
        "lease_seconds": 1200.0,
        "debounce_seconds": 0.0,
        "tick_seconds": 0.5,
        "retry_backoff_seconds": 1.0,
        "retry_backoff_max_seconds": 2.0,
    }
    values.update(overrides)
    return MemqSettings(**values)


def _settled(settings: MemqSettings, before: dict[str, int]) -> bool:
    """A run ended (saved, or dead) since ``before`` and nothing is due or in flight."""
    from worker.queue import QueueClient

    client = redis_client(settings)
    try:
        counts = read_counts(client, settings)
        stats = QueueClient(settings, client).stats()
    finally:
        client.close()
    ended = sum(
        counts.get(f"extractions:{o}", 0) - before.get(f"extractions:{o}", 0)
        for o in ("updated", "unchanged", "skipped", "dead")
    )
    return ended >= 1 and stats["due"] == 0 and stats["inflight"] == 0


def run_conversation(settings: MemqSettings, case: Conversation, index: int) -> Outcome:
    from producer.producer import MemoryProducer
    from storage import get_storage

    user = f"probe-{index}@example.com"
    start_counts = _counts(settings)
    seconds = []
    history: list[dict[str, str]] = []
    with MemoryProducer(settings) as producer:
        for session in case.sessions:
            history += [{"role": role, "content": text} for role, text in session]
            before = _counts(settings)
            started = time.monotonic()
            if not producer.flush(f"thread-{index}", user, None, list(history)):
                raise RuntimeError("the flush was not enqueued")
            deadline = started + EXTRACTION_SECONDS
            while not _settled(settings, before):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{case.name}: not settled in {EXTRACTION_SECONDS:.0f} s")
                time.sleep(0.5)
            seconds.append(time.monotonic() - started)
    counts = _counts(settings)
    delta = {k: counts.get(k, 0) - start_counts.get(k, 0) for k in counts}
    facts = [f.content for f in get_storage(settings).load(user, None).facts]
    text = " ".join(facts).casefold()
    return Outcome(
        name=case.name,
        facts=facts,
        learnt=any(word in text for word in case.expect),
        clean=not any(word in text for word in case.never),
        dead=delta.get("extractions:dead", 0),
        retries=delta.get("extractions:retry", 0),
        seconds=seconds,
        llm_seconds=delta.get("llm_latency_sum_ms", 0) / 1000,
        calls=delta.get("llm_latency_count", 0),
        counters={name: delta.get(name, 0) for name in SHAPE_COUNTERS},
    )


def _counts(settings: MemqSettings) -> dict[str, int]:
    client = redis_client(settings)
    try:
        return read_counts(client, settings)
    finally:
        client.close()


def row(o: Outcome) -> str:
    """One conversation's line of the table."""
    learnt = ("yes" if o.learnt else "NO") + ("" if o.clean else " (and a claim it must not)")
    facts = "; ".join(f.replace("|", "/") for f in o.facts) or "(none)"
    per = ", ".join(f"{s:.0f}" for s in o.seconds)
    shape = " / ".join(str(o.counters[name]) for name in SHAPE_COUNTERS)
    return (
        f"| {o.name} | {learnt} | {facts} | {o.dead} | {o.retries} | {per} | {o.calls} | {shape} |"
    )


def table(outcomes: list[Outcome], form: str) -> str:
    lines = [
        f"prompt {PROMPT_VERSION}, response_format learnt: {form}",
        "",
        "| conversation | learnt its obvious fact | facts learnt | dead letters | second "
        "attempts | s per extraction | model calls | missing fields / invalid / unknown ids / "
        "refused / repaired |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    lines.extend(row(o) for o in outcomes)
    total = sum(len(o.seconds) for o in outcomes)
    wall = sum(sum(o.seconds) for o in outcomes)
    model = sum(o.llm_seconds for o in outcomes)
    lines.append("")
    lines.append(
        f"{sum(o.learnt and o.clean for o in outcomes)} of {len(outcomes)} learnt their obvious "
        f"fact, {sum(o.dead for o in outcomes)} dead letters, {sum(o.retries for o in outcomes)} "
        f"second attempts; {total} extractions in {wall:.0f} s (the model: {model:.0f} s)"
    )
    return "\n".join(lines)


def learnt_form(log_dir: Path) -> str:
    """The response format the worker stepped down to (its log says so), else the first one."""
    found = "json_schema"
    for path in log_dir.rglob("*.log"):
        for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
            if "asking for" in line and "from now on" in line:
                found = line.split("asking for", 1)[1].split("from now on", 1)[0].strip()
    return found


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n", 1)[0])
    parser.add_argument("--base-url", help="an OpenAI-compatible endpoint already running")
    parser.add_argument("--model", default="qwen15", help="serve.sh's model key (default qwen15)")
    parser.add_argument(
        "--llm-dir", type=Path, default=Path(os.environ.get("MEMQ_LOCAL_LLM_DIR", DEFAULT_LLM_DIR))
    )
    parser.add_argument("--only", help="comma-separated conversation numbers (1-based)")
    parser.add_argument("--response-format", default="auto", help="MEMQ_LLM_RESPONSE_FORMAT")
    parser.add_argument("--out", type=Path, help="also write the table to this file")
    args = parser.parse_args(argv)
    # A stopped probe stops what it started (the model server, redis, Celery): SIGTERM unwinds
    # like Ctrl-C, which a probe run in the background does not get.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(128 + signal.SIGTERM))
    chosen = [
        (n, c)
        for n, c in enumerate(CONVERSATIONS, 1)
        if not args.only or str(n) in args.only.split(",")
    ]
    from memq.testing.celery_procs import CeleryProcs, memq_env

    with tempfile.TemporaryDirectory(prefix="memq-probe-") as scratch:
        work = Path(scratch)
        with contextlib.ExitStack() as stack:
            base_url = args.base_url or stack.enter_context(
                local_model(args.llm_dir, args.model, work / "model.log")
            )
            redis = RedisServer(work / "redis", appendonly=False)
            redis.start()
            stack.callback(redis.stop)
            settings = probe_settings(
                redis.url, base_url, work, llm_response_format=args.response_format
            )
            procs = CeleryProcs(work / "celery")
            stack.callback(procs.stop)
            env = memq_env(settings)
            procs.start_worker(env, concurrency=1, pool="threads")
            procs.start_beat(env)
            outcomes = []
            for number, case in chosen:
                print(f"== {number}. {case.name} …", flush=True)
                outcome = run_conversation(settings, case, number)
                # The row at once: a run stopped half-way (the model is slow) keeps what it saw.
                print(f"   {row(outcome)}", flush=True)
                outcomes.append(outcome)
            report = table(outcomes, learnt_form(work / "celery"))
    print(report)
    if args.out:
        args.out.write_text(report + "\n", encoding="utf-8")
    return 0 if all(o.learnt and o.clean and not o.dead for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
