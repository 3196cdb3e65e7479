"""Building blocks of the reliability scenarios (tests/test_reliability_*.py).

A scripted model that "learns" exactly the tokens a conversation carries: every ``item-<n>`` in the
``<conversation>`` slot of the update prompt becomes the fact ``The user owns item-<n>``. A test
then knows which facts must exist at the end, and can count them for duplicates.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memq.core.settings import MemqSettings
from memq.local.redis_server import RedisServer
from memq.memory.update import NewFact, UpdateAnswer
from memq.testing.openai_server import update_text
from memq.testing.redis_procs import private_redis
from producer import MemoryProducer
from storage import get_storage
from storage.document import MemoryDocument
from tests.support.openai_server import Reply, ScriptedOpenAI
from worker.queue import QueueClient

ITEM = re.compile(r"item-\d+")
_CONVERSATION = re.compile(r"<conversation>\n([\s\S]*?)\n</conversation>")


def conversation_of(request: dict[str, Any]) -> str:
    """The ``<conversation>`` slot of an update prompt request ("" when there is none)."""
    text = "\n".join(str(m.get("content", "")) for m in request.get("messages", []))
    found = _CONVERSATION.search(text)
    return found.group(1) if found else ""


def fact_for(item: str) -> str:
    return f"The user owns {item}"


def update_answer(*facts: str) -> str:
    return update_text(
        UpdateAnswer(
            new_facts=tuple(NewFact(content=f, category="context", confidence=0.95) for f in facts)
        )
    )


def learn_items(request: dict[str, Any]) -> Reply:
    """The healthy model: one fact per ``item-<n>`` mentioned in the conversation."""
    items = sorted(set(ITEM.findall(conversation_of(request))))
    return Reply(content=update_answer(*(fact_for(item) for item in items)))


def turn(item: str, extra: str = "") -> list[dict[str, str]]:
    return [
        {"role": "user", "content": f"Please remember that I own {item}. {extra}".strip()},
        {"role": "assistant", "content": f"Got it, you own {item}."},
    ]


def stack_settings(make_settings: Any, server: ScriptedOpenAI, **overrides: Any) -> MemqSettings:
    """Settings for a stack on the scripted server, with short timings (overridable)."""
    values: dict[str, Any] = {
        "llm_provider": "openai",
        "llm_base_url": server.base_url,
        "llm_api_key": "sk-scripted",
        "llm_max_retries": 0,
        "llm_timeout_seconds": 10.0,
        "tick_seconds": 0.2,
        "lease_seconds": 30.0,
        "debounce_seconds": 0.0,
        "max_delay_seconds": 10.0,
        "retry_backoff_seconds": 0.2,
        "retry_backoff_max_seconds": 1.0,
        "token_counting": False,
    }
    values.update(overrides)
    return make_settings(**values)  # type: ignore[no-any-return]


def facts_of(settings: MemqSettings, user: str, agent: str | None = None) -> list[str]:
    return [fact.content for fact in get_storage(settings).load(user, agent).facts]


def document_of(settings: MemqSettings, user: str, agent: str | None = None) -> MemoryDocument:
    return get_storage(settings).load(user, agent)


def queue_idle(queue: QueueClient) -> bool:
    stats = queue.stats()
    return stats["due"] == 0 and stats["inflight"] == 0


@pytest.fixture
def producer_for() -> Iterator[Any]:
    """Builds producers and always closes them."""
    made: list[MemoryProducer] = []

    def build(settings: MemqSettings) -> MemoryProducer:
        made.append(MemoryProducer(settings))
        return made[-1]

    yield build
    for producer in made:
        producer.close()


@pytest.fixture
def aof_redis(tmp_path: Path) -> Iterator[RedisServer]:
    """A private redis-server with AOF (a test may stop, pause and restart it on its port)."""
    with private_redis(tmp_path / "aof-redis") as server:
        yield server
