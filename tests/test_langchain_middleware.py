"""memq in a real LangChain v1 agent: ``langchain.agents.create_agent`` with a scripted fake chat
model from langchain_core, memq's middleware, a real Redis, a real Celery worker and beat, and the
real openai client against the scripted server (which learns ``item-<n>`` facts)."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from memq.core.settings import MemqSettings
from memq.integrations.langchain import (
    MemoryFlushingSummarization,
    MemoryMiddleware,
    MissingRunIdentity,
    latest_user_text,
    with_memory,
)
from producer import MemoryProducer
from prompts.injection import FRAME_LINE
from storage import get_storage
from storage.document import Fact, MemoryDocument
from tests.support.celery_procs import CeleryProcs, memq_env
from tests.support.openai_server import ScriptedOpenAI
from tests.support.scenarios import conversation_of, fact_for, learn_items, stack_settings
from tests.support.waiting import wait_for


class RecordingFakeChat(GenericFakeChatModel):
    """GenericFakeChatModel that keeps every input it was called with."""

    seen: list[list[BaseMessage]] = []  # noqa: RUF012  (a pydantic field, replaced per instance)
    before_reply: Any = None  # called before answering, to order a test's events

    def _generate(self, messages: list[BaseMessage], *args: Any, **kwargs: Any) -> Any:
        self.seen.append(list(messages))
        if self.before_reply is not None:
            self.before_reply()
        return super()._generate(messages, *args, **kwargs)


def fake_model(*replies: str) -> RecordingFakeChat:
    return RecordingFakeChat(messages=iter([AIMessage(r) for r in replies]), seen=[])


def model_input_text(model: RecordingFakeChat, call: int = -1) -> str:
    return "\n".join(str(m.content) for m in model.seen[call])


def facts(settings: MemqSettings, user: str, agent: str | None) -> list[str]:
    return [f.content for f in get_storage(settings).load(user, agent).facts]


@pytest.fixture
def stack(
    make_settings: Any, openai_server: ScriptedOpenAI, celery_procs: CeleryProcs
) -> Iterator[MemqSettings]:
    openai_server.responder = learn_items
    settings = stack_settings(make_settings, openai_server)
    celery_procs.start_worker(memq_env(settings))
    celery_procs.start_beat(memq_env(settings))
    yield settings


@pytest.fixture
def producers() -> Iterator[list[MemoryProducer]]:
    made: list[MemoryProducer] = []
    yield made
    for producer in made:
        producer.close()


def middleware(settings: MemqSettings, producers: list[MemoryProducer]) -> MemoryMiddleware:
    memory = MemoryMiddleware(settings, agent_name="helper")
    producers.append(memory.producer)
    return memory


@pytest.mark.e2e
@pytest.mark.integration
def test_run_one_teaches_run_two_sees_it(stack: MemqSettings, producers: Any) -> None:
    model = fake_model("Noted, item-1 is yours.", "You own item-1.")
    agent = create_agent(model, tools=[], middleware=[middleware(stack, producers)])
    config = {"configurable": {"thread_id": "t-1", "user_id": "alice"}}
    agent.invoke({"messages": [HumanMessage("Please remember that I own item-1.")]}, config)
    wait_for(
        lambda: fact_for("item-1") in facts(stack, "alice", "helper"),
        what="run 1's fact in memory",
    )
    config2 = {"configurable": {"thread_id": "t-2", "user_id": "alice"}}
    result = agent.invoke({"messages": [HumanMessage("What do I own?")]}, config2)
    seen = model_input_text(model)
    assert "<user_memory>" in seen and fact_for("item-1") in seen
    # The block lives in the model call only, never in the conversation.
    assert all("<user_memory>" not in str(m.content) for m in result["messages"])


@pytest.mark.e2e
@pytest.mark.integration
def test_async_path_with_runtime_context(stack: MemqSettings, producers: Any) -> None:
    model = fake_model("Noted, item-2.", "You own item-2.")
    agent = create_agent(
        model, tools=[], middleware=[middleware(stack, producers)], context_schema=dict
    )

    async def scenario() -> None:
        await agent.ainvoke(
            {"messages": [HumanMessage("Please remember that I own item-2.")]},
            context={"thread_id": "t-a", "user_id": "bob"},
        )
        await asyncio.to_thread(
            wait_for,
            lambda: fact_for("item-2") in facts(stack, "bob", "helper"),
            what="the async run's fact",
        )
        await agent.ainvoke(
            {"messages": [HumanMessage("What do I own?")]},
            context={"thread_id": "t-b", "user_id": "bob"},
        )

    asyncio.run(scenario())
    assert fact_for("item-2") in model_input_text(model)


@pytest.mark.e2e
@pytest.mark.integration
@pytest.mark.parametrize("use_async", [False, True])
def test_summarisation_flushes_what_it_summarises_away(
    stack: MemqSettings, openai_server: ScriptedOpenAI, producers: Any, use_async: bool
) -> None:
    memory = middleware(stack, producers)
    summary_model = fake_model("The user and the assistant chatted.")

    def flushed_messages_extracted() -> None:
        # The summary is written only once the flushed messages reached the extraction model:
        # the flush happens before the summary, and it is due at once.
        wait_for(
            lambda: any("item-7" in conversation_of(r) for r in openai_server.requests),
            what="the flushed messages at the extraction model",
        )

    summary_model.before_reply = flushed_messages_extracted
    summariser = MemoryFlushingSummarization(
        summary_model,
        producer=memory.producer,
        agent_name="helper",
        trigger=("messages", 6),
        keep=("messages", 2),
    )
    model = fake_model("Fine.")
    agent = create_agent(model, tools=[], middleware=[memory, summariser])
    history: list[BaseMessage] = [
        HumanMessage("Please remember that I own item-7."),
        AIMessage("Got it, item-7."),
        HumanMessage("Nice weather today."),
        AIMessage("Indeed."),
        HumanMessage("How are you?"),
        AIMessage("Fine."),
        HumanMessage("Tell me a joke."),
    ]
    config = {"configurable": {"thread_id": "t-s", "user_id": "carol"}}
    if use_async:
        result = asyncio.run(agent.ainvoke({"messages": history}, config))
    else:
        result = agent.invoke({"messages": history}, config)
    final = "\n".join(str(m.content) for m in result["messages"])
    assert "item-7" not in final  # summarised away before the run ended...
    wait_for(
        lambda: fact_for("item-7") in facts(stack, "carol", "helper"),
        what="the flushed fact",
    )  # ...yet memq learned it, from the flush


def test_missing_ids_are_named(make_settings: Any, producers: Any) -> None:
    settings = make_settings()
    agent = create_agent(fake_model("hi"), tools=[], middleware=[middleware(settings, producers)])
    with pytest.raises(MissingRunIdentity, match="'user_id'"):
        agent.invoke({"messages": [HumanMessage("hello")]}, {"configurable": {"thread_id": "t"}})
    agent = create_agent(fake_model("hi"), tools=[], middleware=[middleware(settings, producers)])
    with pytest.raises(MissingRunIdentity, match="'thread_id'"):
        agent.invoke({"messages": [HumanMessage("hello")]}, {"configurable": {"user_id": "u"}})


def test_memq_down_never_reaches_the_agent(make_settings: Any, producers: Any) -> None:
    from memq.local.redis_server import free_port

    settings = make_settings(
        redis_url=f"redis://127.0.0.1:{free_port()}/0",
        storage="redis",
        producer_timeout_seconds=0.1,
    )
    memory = middleware(settings, producers)
    model = fake_model("Still here.")
    agent = create_agent(model, tools=[], middleware=[memory])
    config = {"configurable": {"thread_id": "t", "user_id": "dave"}}
    result = agent.invoke({"messages": [HumanMessage("I own item-9.")]}, config)
    assert result["messages"][-1].content == "Still here."
    assert memory.producer.spool_size == 1  # kept for when Redis is back


def test_query_is_the_latest_user_message_and_recall_uses_it(
    make_settings: Any, producers: Any
) -> None:
    assert latest_user_text([HumanMessage("a"), AIMessage("b"), HumanMessage("c")]) == "c"
    assert latest_user_text([AIMessage("b")]) is None
    assert with_memory(None, "M").content == "M"
    settings = make_settings(token_counting=False, injected_memory_max_tokens=50)
    get_storage(settings).save(
        "erin",
        "helper",
        MemoryDocument(
            facts=[
                Fact(
                    content="Works at Acme on billing in Go, " + "mostly on invoices " * 8,
                    confidence=0.95,
                ),
                Fact(content="Deploys with uvicorn behind nginx", confidence=0.6),
            ]
        ),
    )
    model = fake_model("ok")
    agent = create_agent(model, tools=[], middleware=[middleware(settings, producers)])
    config = {"configurable": {"thread_id": "t", "user_id": "erin"}}
    agent.invoke({"messages": [HumanMessage("how should I run uvicorn?")]}, config)
    seen = model_input_text(model)
    assert "uvicorn behind nginx" in seen and "Acme" not in seen
    assert f"<user_memory>\n{FRAME_LINE}\n" in seen  # framed as data, never instructions


@pytest.mark.e2e
@pytest.mark.integration
def test_summarised_messages_survive_the_end_of_run_hand_off(
    stack: MemqSettings, producers: Any
) -> None:
    """The run ends (after_agent hands over the summarised, shorter history) before the tick
    claimed the flushed context: what was summarised away must still be extracted."""
    memory = middleware(stack, producers)
    summariser = MemoryFlushingSummarization(
        fake_model("The user and the assistant chatted."),
        producer=memory.producer,
        agent_name="helper",
        trigger=("messages", 6),
        keep=("messages", 2),
    )
    agent = create_agent(fake_model("Fine."), tools=[], middleware=[memory, summariser])
    history: list[BaseMessage] = [
        HumanMessage("Please remember that I own item-8."),
        AIMessage("Got it, item-8."),
        HumanMessage("Nice weather today."),
        AIMessage("Indeed."),
        HumanMessage("How are you?"),
        AIMessage("Fine."),
        HumanMessage("Tell me a joke."),
    ]
    agent.invoke({"messages": history}, {"configurable": {"thread_id": "t-r", "user_id": "fay"}})
    wait_for(
        lambda: fact_for("item-8") in facts(stack, "fay", "helper"),
        what="the summarised-away fact",
    )
