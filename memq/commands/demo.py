"""`memq demo`: the whole system on one machine, from nothing, in well under a minute.

Starts the embedded stack (a private redis-server, a Celery worker and the ticker), feeds the sample
conversations in ``demo_conversations.json`` through :class:`MemoryProducer` exactly as agents do,
flushes them, waits until the queue is empty (a condition with a deadline), and prints what memq
learned about each user and the block an agent would get. Everything lives under the demo folder.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, TextIO

from memq.commands.common import CommandContext, agent_label, format_table, shown
from memq.core.errors import MemqError
from memq.core.settings import MemqSettings, load_settings
from memq.local.options import StackOptions
from memq.local.stack import Stack

DEFAULT_DEMO_DIR = Path(".memq/demo")


class DemoFailed(MemqError, RuntimeError):
    """The demo's extractions did not finish (a dead letter, a dead process, or the deadline)."""


@dataclass(frozen=True)
class Conversation:
    thread: str
    user: str
    agent: str | None
    language: str
    messages: list[dict[str, Any]]


def sample_conversations() -> list[Conversation]:
    raw = json.loads(
        resources.files("memq").joinpath("demo_conversations.json").read_text(encoding="utf-8")
    )
    return [
        Conversation(c["thread"], c["user"], c["agent"], c["language"], c["messages"])
        for c in raw["conversations"]
    ]


def demo_settings(data_dir: Path) -> MemqSettings:
    """Short debounce and tick so the demo finishes quickly; the LLM settings stay as configured."""
    # The default key prefix: `memq up` on the demo's folder, and the commands run after it,
    # find the demo's memory with nothing but MEMQ_DATA_DIR.
    return load_settings(
        data_dir=data_dir,
        debounce_seconds=0.5,
        max_delay_seconds=5.0,
        tick_seconds=0.2,
        worker_concurrency=2,
    )


def run_demo(
    data_dir: Path = DEFAULT_DEMO_DIR, *, timeout_seconds: float = 120.0, out: TextIO | None = None
) -> int:
    out = out or sys.stdout
    data_dir = data_dir.resolve()
    # A fresh start each run: the demo's own memory and Redis files only.
    for folder in ("memory", "redis"):
        shutil.rmtree(data_dir / folder, ignore_errors=True)
    settings = demo_settings(data_dir)
    conversations = sample_conversations()
    _say(out, f"memq demo — data in {data_dir}")
    _say(out, f"extractor: {_describe_extractor(settings)}")
    options = StackOptions(flower=False, private_redis=True, log_dir=data_dir / "logs")
    _say(out, "starting a private redis-server, a Celery worker and the ticker (beat) …")
    with Stack(settings, options) as stack:
        settings = stack.settings  # now pointing at the private Redis
        _feed(settings, conversations, out)
        _say(out, "waiting for the workers to extract the memory …")
        started = time.monotonic()
        _wait_until_extracted(stack, settings, timeout_seconds)
        _say(out, f"done in {time.monotonic() - started:.1f} s\n")
        _report(settings, conversations, out)
        _say(out, "stopping the stack …")
    shown_dir = _shown_dir(data_dir)
    _say(out, f"stopped. The demo's memory is kept in {data_dir}. To read it again:")
    _say(out, "  source .venv/bin/activate   # memq on PATH (or call .venv/bin/memq)")
    _say(out, f"  MEMQ_DATA_DIR={shown_dir} memq up   # the demo's stack, in the foreground")
    _say(out, f"  then in another terminal: MEMQ_DATA_DIR={shown_dir} memq show alice")
    _say(out, "`memq up` alone runs your own stack in .memq; `memq --help` for the rest.")
    return 0


def _shown_dir(data_dir: Path) -> str:
    """The folder as the user would type it: relative to where they are, when it is below."""
    try:
        return str(data_dir.relative_to(Path.cwd()))
    except ValueError:
        return str(data_dir)


def _describe_extractor(settings: MemqSettings) -> str:
    if settings.resolved_llm_provider == "rules":
        return (
            "offline rules extractor (no MEMQ_LLM_BASE_URL or OPENAI_API_KEY set; "
            "set one for model-quality extraction)"
        )
    base = settings.llm_base_url or "the OpenAI API"
    return f"LLM {settings.llm_model} at {base}"


def _feed(settings: MemqSettings, conversations: list[Conversation], out: TextIO) -> None:
    from producer.producer import MemoryProducer

    with MemoryProducer(settings) as producer:
        for conv in conversations:
            # after_agent once per turn, as the agent hook would, then a flush at the end.
            for end in range(2, len(conv.messages) + 1, 2):
                producer.after_agent(conv.thread, conv.user, conv.agent, conv.messages[:end])
            sent = producer.flush(conv.thread, conv.user, conv.agent, conv.messages)
            if not sent:
                raise DemoFailed(f"could not enqueue thread {conv.thread} (Redis unreachable?)")
            _say(
                out,
                f"  enqueued {conv.thread}: user {conv.user}, agent {agent_label(conv.agent)}, "
                f"{len(conv.messages)} messages ({conv.language})",
            )


def _wait_until_extracted(stack: Stack, settings: MemqSettings, timeout_seconds: float) -> None:
    """Done when nothing is due or in flight; a dead letter or a dead process fails fast."""
    from memq.core.connection import redis_client
    from worker.queue import QueueClient

    client = redis_client(settings, max_connections=2)
    try:
        queue = QueueClient(settings, client)
        deadline = time.monotonic() + timeout_seconds
        while True:
            stack.check()
            stats = queue.stats()
            if stats["dead"]:
                reasons = "; ".join(f"{e.context_id}: {e.last_error}" for e in queue.dead_list())
                raise DemoFailed(f"extraction failed: {reasons}")
            if stats["due"] == 0 and stats["inflight"] == 0:
                return
            if time.monotonic() > deadline:
                raise DemoFailed(
                    f"extraction did not finish within {timeout_seconds:.0f} s "
                    f"(due {stats['due']}, in flight {stats['inflight']}); "
                    f"see the logs in {stack.options.log_dir}"
                )
            time.sleep(0.1)  # poll interval of a condition with a deadline
    finally:
        client.close()


def _report(settings: MemqSettings, conversations: list[Conversation], out: TextIO) -> None:
    from producer.injector import MemoryInjector
    from storage import get_storage

    storage = get_storage(settings)
    injector = MemoryInjector(settings, storage)
    pairs = list(dict.fromkeys((c.user, c.agent) for c in conversations))
    for user, agent in pairs:
        document = storage.load(user, agent)
        _say(out, f"== what memq learned about {user} (agent {agent_label(agent)})")
        rows = [(f.category, f"{f.confidence:.2f}", f.content) for f in document.facts]
        if rows:
            _say(out, format_table(("category", "confidence", "fact"), rows, wrap=90))
        else:
            _say(out, "(no facts)")
        for section in ("work_context", "personal_context", "top_of_mind"):
            summary = getattr(document.user, section).summary.strip()
            if summary:
                _say(out, f"{section.replace('_', ' ')}: {shown(summary)}")
        _say(out, f"\n-- the block an agent would get (MemoryInjector.block({user!r}, {agent!r}))")
        _say(out, shown(injector.block(user, agent), keep_newlines=True) or "(empty)")
        _say(out, "")


def _say(out: TextIO, text: str) -> None:
    out.write(text + "\n")
    out.flush()


def register(sub: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    parser = sub.add_parser(
        "demo",
        help="run the embedded stack on sample conversations and print what memq learned",
    )
    parser.add_argument(
        "--data-dir",
        type=Path,
        default=DEFAULT_DEMO_DIR,
        help=f"demo folder (default {DEFAULT_DEMO_DIR})",
    )
    parser.add_argument(
        "--timeout", type=float, default=120.0, help="seconds to wait for the extractions"
    )
    parser.set_defaults(run=run)


def run(args: argparse.Namespace, context: CommandContext) -> int:
    return run_demo(args.data_dir, timeout_seconds=args.timeout)
