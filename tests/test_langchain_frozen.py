"""``MemoryMiddleware(freeze="thread")``: the memory block is read on a thread's first run and the
same bytes are reused by every later run of that thread, appended after the agent's own system
prompt, so the agent's prompt cache (a prefix cache) is not broken by memq on every turn.

Real LangChain v1 agents (``create_agent`` with langchain_core's fake chat model, an in-memory
checkpointer so a thread really continues) against a real redis-server; memory is changed between
runs by writing the stored document, as a worker would."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage
from langgraph.checkpoint.memory import InMemorySaver

from memq.core.settings import MemqSettings
from memq.integrations.langchain import FrozenBlocks, MemoryMiddleware
from memq.testing.redis_procs import kill_redis, private_redis
from memq.testing.waiting import wait_for
from producer.injector import MemoryInjector
from storage import get_storage
from storage.document import Fact, MemoryDocument

# Long and static, as an agent's real system prompt is: the part a provider caches.
STATIC_PROMPT = "You are a careful assistant for invoices. Answer briefly and cite sources. " * 40
USER = "alice@example.com"
AGENT = "helper"


class RecordingFakeChat(GenericFakeChatModel):
    """GenericFakeChatModel that keeps every input it was called with."""

    seen: list[list[BaseMessage]] = []  # noqa: RUF012  (a pydantic field, replaced per instance)

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        self.seen.append(list(messages))
        return super()._generate(messages, *args, **kwargs)


def fake_model() -> RecordingFakeChat:
    return RecordingFakeChat(messages=iter([AIMessage("ok")] * 200), seen=[])


def system_of(model: RecordingFakeChat, call: int = -1) -> str:
    """The system message the model saw on one call (its text, exactly)."""
    first = model.seen[call][0]
    assert first.type == "system"
    assert isinstance(first.content, str)
    return first.content


class CountedReads:
    """The real storage, counting the memory reads that reach it."""

    def __init__(self, settings: MemqSettings) -> None:
        self.storage = get_storage(settings)
        self.loads = 0

    def load(self, user_id: str, agent_name: str | None) -> MemoryDocument:
        self.loads += 1
        return self.storage.load(user_id, agent_name)

    def view(self, user_id: str, agent_name: str | None) -> MemoryDocument:
        self.loads += 1  # the injector's read that shares the storage's parse: a read too
        return self.storage.view(user_id, agent_name)  # type: ignore[no-any-return]

    def __getattr__(self, name: str) -> Any:
        return getattr(self.storage, name)


def remember(settings: MemqSettings, *contents: str, user: str = USER) -> None:
    """Replace the stored memory (what a worker does after an extraction)."""
    document = MemoryDocument(facts=[Fact(content=c, confidence=0.9) for c in contents])
    get_storage(settings).save(user, AGENT, document)


@pytest.fixture
def memories() -> Iterator[list[MemoryMiddleware]]:
    made: list[MemoryMiddleware] = []
    yield made
    for memory in made:
        memory.producer.close()
        memory.injector.close()


def build(
    settings: MemqSettings, memories: list[MemoryMiddleware], **options: Any
) -> tuple[Any, RecordingFakeChat]:
    memory = MemoryMiddleware(settings, agent_name=AGENT, **options)
    memories.append(memory)
    model = fake_model()
    agent = create_agent(
        model,
        tools=[],
        system_prompt=STATIC_PROMPT,
        middleware=[memory],
        checkpointer=InMemorySaver(),
    )
    return agent, model


def run(agent: Any, thread: str, text: str, user: str = USER) -> None:
    agent.invoke({"messages": [HumanMessage(text)]}, ids(thread, user))


def ids(thread: str, user: str) -> Any:
    # The checkpointer keys the thread by config["configurable"]["thread_id"]; memq reads the same.
    return {"configurable": {"thread_id": thread, "user_id": user}}


@pytest.fixture
def redis_settings(make_settings: Any) -> MemqSettings:
    return make_settings(storage="redis")  # type: ignore[no-any-return]


def test_three_runs_of_a_thread_see_byte_identical_system_messages(
    redis_settings: MemqSettings, memories: Any
) -> None:
    reads = CountedReads(redis_settings)
    injector = MemoryInjector(redis_settings, storage=reads)  # type: ignore[arg-type]
    agent, model = build(redis_settings, memories, freeze="thread", injector=injector)
    remember(redis_settings, "Works at Acme on billing")
    run(agent, "auth0|abc", "Hello, what do you know about me?")
    remember(redis_settings, "Works at Initech on payroll")
    run(agent, "auth0|abc", "And now?")
    remember(redis_settings, "Moved to Globex")
    run(agent, "auth0|abc", "Anything new?")
    systems = [system_of(model, call) for call in range(3)]
    assert systems[0] == systems[1] == systems[2]  # the very same bytes, three times
    assert systems[0].startswith(STATIC_PROMPT)  # the agent's own prompt first, untouched
    assert "Acme" in systems[0] and "Initech" not in systems[0] and "Globex" not in systems[0]
    assert systems[0].index("<user_memory>") >= len(STATIC_PROMPT)  # memory after it
    # The conversation really continued (the checkpointer kept it); only memory stood still.
    assert len(model.seen[2]) > len(model.seen[0])
    assert reads.loads == 1  # and the later runs cost no memory read at all

    # A new thread reads the memory as it is now, and freezes that.
    run(agent, "auth0|abd", "Hi again")
    fresh = system_of(model)
    assert "Globex" in fresh and "Acme" not in fresh
    assert fresh.startswith(STATIC_PROMPT)


def test_the_default_still_reads_memory_on_every_run(
    redis_settings: MemqSettings, memories: Any
) -> None:
    agent, model = build(redis_settings, memories)
    remember(redis_settings, "Works at Acme on billing")
    run(agent, "t-1", "Hello")
    remember(redis_settings, "Works at Initech on payroll")
    run(agent, "t-1", "And now?")
    assert "Acme" in system_of(model, 0)
    assert "Initech" in system_of(model, 1) and "Acme" not in system_of(model, 1)


def test_threads_users_and_agents_are_frozen_apart(
    redis_settings: MemqSettings, memories: Any
) -> None:
    agent, model = build(redis_settings, memories, freeze="thread")
    remember(redis_settings, "Alice likes tea")
    remember(redis_settings, "Bob likes coffee", user="auth0|bob")
    # The same thread id used by two users: each gets their own block, never the other's.
    run(agent, "shared|thread", "hi")
    run(agent, "shared|thread", "hi", user="auth0|bob")
    assert "Alice likes tea" in system_of(model, 0)
    assert "Bob likes coffee" in system_of(model, 1) and "Alice" not in system_of(model, 1)


def test_an_outage_on_the_first_run_freezes_nothing(
    make_settings: Any, memories: Any, tmp_path: Path
) -> None:
    with private_redis(tmp_path / "redis") as server:
        settings = make_settings(
            redis_url=server.url, storage="redis", injector_timeout_seconds=0.2
        )
        remember(settings, "Works at Acme on billing")
        agent, model = build(settings, memories, freeze="thread")
        kill_redis(server)
        run(agent, "t-out", "Hello")  # memq is down: the run goes on without memory
        assert "<user_memory>" not in system_of(model)
        assert system_of(model) == STATIC_PROMPT
        server.start()

        def sees_memory() -> bool:
            # Once the injector's back-off ends, the next run of the same thread reads again.
            run(agent, "t-out", "Still there?")
            return "Acme" in system_of(model)

        wait_for(sees_memory, what="the thread reading memory after the outage")
        frozen = system_of(model)
        remember(settings, "Moved to Globex")
        run(agent, "t-out", "And now?")
        assert system_of(model) == frozen  # frozen from the first good read on


def test_the_async_path_freezes_too(redis_settings: MemqSettings, memories: Any) -> None:
    agent, model = build(redis_settings, memories, freeze="thread")

    async def scenario() -> None:
        for fact, text in [("Likes tea", "hi"), ("Likes coffee", "and?"), ("Likes mate", "so?")]:
            await asyncio.to_thread(remember, redis_settings, fact)
            await agent.ainvoke({"messages": [HumanMessage(text)]}, ids("t-async", USER))

    asyncio.run(scenario())
    systems = {system_of(model, call) for call in range(3)}
    assert len(systems) == 1
    (system,) = systems
    assert system.startswith(STATIC_PROMPT) and "Likes tea" in system


def test_the_ttl_lets_a_long_thread_refresh(redis_settings: MemqSettings, memories: Any) -> None:
    agent, model = build(redis_settings, memories, freeze="thread", freeze_ttl_seconds=0.3)
    remember(redis_settings, "Works at Acme on billing")
    run(agent, "t-long", "Hello")
    remember(redis_settings, "Moved to Globex")

    def refreshed() -> bool:
        run(agent, "t-long", "Anything new?")
        return "Globex" in system_of(model)

    wait_for(refreshed, what="the frozen block expiring")
    assert system_of(model).startswith(STATIC_PROMPT)


def test_the_cache_is_bounded_and_forgets_the_least_recent_thread(
    redis_settings: MemqSettings, memories: Any
) -> None:
    agent, model = build(redis_settings, memories, freeze="thread", freeze_max_threads=2)
    remember(redis_settings, "Works at Acme on billing")
    run(agent, "t-1", "hi")
    run(agent, "t-2", "hi")
    run(agent, "t-1", "hi again")  # t-1 is now the most recent
    run(agent, "t-3", "hi")  # evicts t-2
    remember(redis_settings, "Moved to Globex")
    run(agent, "t-1", "still?")
    assert "Acme" in system_of(model)  # kept
    run(agent, "t-2", "back")
    assert "Globex" in system_of(model)  # forgotten, read again


def test_frozen_blocks_unit_rules() -> None:
    now = [0.0]
    blocks = FrozenBlocks(max_entries=2, ttl_seconds=10.0, clock=lambda: now[0])
    key = ("t", USER, AGENT)
    assert blocks.get(key) is None
    assert blocks.keep(key, "A") == "A"
    assert blocks.keep(key, "B") == "A"  # a racing first run gets the block already frozen
    assert blocks.get(key) == "A"
    now[0] = 10.0
    assert blocks.get(key) is None  # expired
    assert blocks.keep(key, "C") == "C"
    # Hostile ids are opaque parts of a tuple: no separator can make two keys collide.
    assert blocks.get(("t|" + USER, "", AGENT)) is None
    assert len(blocks) == 1


@pytest.mark.parametrize(
    ("options", "message"),
    [
        ({"freeze": "forever"}, "freeze"),
        ({"freeze": "thread", "freeze_max_threads": 0}, "freeze_max_threads"),
        ({"freeze": "thread", "freeze_ttl_seconds": 0}, "freeze_ttl_seconds"),
        ({"freeze": "thread", "freeze_ttl_seconds": float("nan")}, "freeze_ttl_seconds"),
        ({"freeze": "thread", "freeze_ttl_seconds": True}, "freeze_ttl_seconds"),
        ({"freeze": "thread", "freeze_max_threads": "10"}, "freeze_max_threads"),
    ],
)
def test_bad_options_are_named(settings: MemqSettings, options: Any, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        MemoryMiddleware(settings, **options)
