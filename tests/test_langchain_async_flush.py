"""``MemoryFlushingSummarization`` on the async path flushes off the event loop: while the flush
waits on a Redis that never answers, the agent's other coroutines keep running."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from langchain.agents import create_agent
from langchain_core.language_models.fake_chat_models import GenericFakeChatModel
from langchain_core.messages import AIMessage, BaseMessage, HumanMessage

from memq.integrations.langchain import MemoryFlushingSummarization
from memq.testing.hung_server import HungServer
from producer import MemoryProducer


def fake_model(*replies: str) -> GenericFakeChatModel:
    return GenericFakeChatModel(messages=iter([AIMessage(r) for r in replies]))


@pytest.mark.integration
def test_the_async_flush_leaves_the_event_loop_responsive(make_settings: Any) -> None:
    with HungServer() as hung:
        settings = make_settings(redis_url=hung.url, producer_timeout_seconds=1.0)
        producer = MemoryProducer(settings)
        try:
            summariser = MemoryFlushingSummarization(
                fake_model("The user and the assistant chatted."),
                producer=producer,
                trigger=("messages", 6),
                keep=("messages", 2),
            )
            agent = create_agent(fake_model("Fine."), tools=[], middleware=[summariser])
            history: list[BaseMessage] = [
                HumanMessage("Please remember that I own item-7."),
                AIMessage("Got it, item-7."),
                HumanMessage("Nice weather today."),
                AIMessage("Indeed."),
                HumanMessage("How are you?"),
                AIMessage("Fine."),
                HumanMessage("Tell me a joke."),
            ]
            spooled_while_flushing: list[int] = []

            async def heartbeat() -> None:
                # Runs once the flush's command reached the hung server: on a free loop that is
                # while the flush still waits for its answer (nothing spooled yet).
                while hung.bytes_received == 0:
                    await asyncio.sleep(0.005)  # wait-ok: polling, under the wait_for below
                spooled_while_flushing.append(producer.stats.spooled)

            async def scenario() -> None:
                beat = asyncio.create_task(heartbeat())
                config: Any = {"configurable": {"thread_id": "t", "user_id": "carol"}}
                await agent.ainvoke({"messages": history}, config)
                await asyncio.wait_for(beat, timeout=10)

            asyncio.run(scenario())
            assert spooled_while_flushing == [0]
            assert producer.stats.spooled == 1  # the flush itself failed open, kept for later
        finally:
            producer.close()
