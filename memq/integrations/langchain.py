"""memq for LangChain v1 agents (``pip install "memq[langchain]"``).

    from langchain.agents import create_agent
    from memq.integrations.langchain import MemoryMiddleware, MemoryFlushingSummarization

    memory = MemoryMiddleware(agent_name="helper")
    agent = create_agent(model, tools, middleware=[
        memory,
        MemoryFlushingSummarization(model, producer=memory.producer, trigger=("tokens", 8000)),
    ])
    agent.invoke({"messages": [...]}, config={"configurable": {"thread_id": "t1", "user_id": "u1"}})

``MemoryMiddleware`` reads the user's memory once per run (before the agent starts: one storage
read, ranked by relevance to the user's latest message) and adds it to the system message of every
model call of that run — never to the message history, so it is not checkpointed, not re-sent to
memory and not stacked up run after run. ``freeze_per_thread=True`` reads it on a thread's first
run only and keeps it for the thread (with a checkpointer), appended after the agent's own static
system prompt, so memq never breaks the agent's prompt cache mid-thread. After the run it hands
the conversation to memq's producer (one Redis round trip; fail-open).
``MemoryFlushingSummarization`` is LangChain's ``SummarizationMiddleware`` that first flushes the
messages it is about to summarise away (due at once), so what they taught is extracted before
they disappear.

The run's ``user_id`` and ``thread_id`` come from the runtime context (a mapping or an object with
those attributes, ``invoke(..., context=...)``) or else from ``config["configurable"]``. A missing
one is a :class:`MissingRunIdentity` naming it: a wiring mistake, raised at once. memq being down
is never raised into the agent: the run gets no memory, and the producer spools.
"""

from __future__ import annotations

import asyncio
import contextvars
import logging
from collections.abc import Awaitable, Callable, Mapping, Sequence
from typing import Annotated, Any, NotRequired

from langchain.agents.middleware import AgentMiddleware, AgentState, SummarizationMiddleware
from langchain.agents.middleware.types import (
    ModelRequest,
    ModelResponse,
    PrivateStateAttr,
)
from langchain_core.messages import AnyMessage, SystemMessage
from langgraph.config import get_config
from langgraph.runtime import Runtime

from memq.core.errors import MemqError
from memq.core.settings import MemqSettings, load_settings
from producer.injector import MemoryInjector
from producer.messages import content_text
from producer.producer import MemoryProducer

log = logging.getLogger(__name__)

STATE_KEY = "memq_memory"
FROZEN_KEY = "memq_frozen_memory"


class MissingRunIdentity(MemqError, LookupError):
    """The run carries no ``user_id`` or ``thread_id`` for memq to file its memory under."""


class MemoryState(AgentState[Any]):
    """The agent state plus the memory block of the current run (private to the middleware);
    with ``freeze_per_thread``, the block frozen for the thread (checkpointed with it)."""

    memq_memory: NotRequired[Annotated[str, PrivateStateAttr]]
    memq_frozen_memory: NotRequired[Annotated[str, PrivateStateAttr]]


def run_value(runtime: Runtime[Any] | None, key: str) -> str | None:
    """``key`` from the runtime context (mapping or attribute), else ``config["configurable"]``."""
    context = getattr(runtime, "context", None)
    value = context.get(key) if isinstance(context, Mapping) else getattr(context, key, None)
    if value is None:
        try:
            value = get_config().get("configurable", {}).get(key)
        except RuntimeError:  # outside a runnable context
            value = None
    return str(value) if value is not None and str(value) else None


def require(runtime: Runtime[Any] | None, key: str) -> str:
    value = run_value(runtime, key)
    if value is None:
        raise MissingRunIdentity(
            f"memq: the run has no {key!r}: pass it in the runtime context "
            f"(invoke(..., context={{{key!r}: ...}})) or in config['configurable'][{key!r}]"
        )
    return value


def latest_user_text(messages: Sequence[AnyMessage]) -> str | None:
    """The text of the last human message: the query memory is ranked against."""
    for message in reversed(messages):
        if getattr(message, "type", None) == "human":
            try:
                return content_text(message.content) or None
            except MemqError:
                return None
    return None


def with_memory(system: SystemMessage | None, block: str) -> SystemMessage:
    """The system message with the memory block appended (a new message; the original stays)."""
    if system is None:
        return SystemMessage(block)
    if isinstance(system.content, str):
        text = f"{system.content}\n\n{block}" if system.content else block
        return SystemMessage(text)
    return SystemMessage([*system.content, {"type": "text", "text": block}])


class MemoryMiddleware(AgentMiddleware[MemoryState, Any, Any]):
    """Injects the user's memory into the run's model calls; hands the conversation to memq
    after the run. ``agent_name`` selects the per-agent memory (None: the user-global one)."""

    state_schema = MemoryState

    def __init__(
        self,
        settings: MemqSettings | None = None,
        *,
        agent_name: str | None = None,
        producer: MemoryProducer | None = None,
        injector: MemoryInjector | None = None,
        use_query: bool = True,
        freeze_per_thread: bool = False,
    ) -> None:
        super().__init__()
        # Frozen: the block is read on a thread's first run (with memory to show) and kept for
        # every later run of that thread (the state is checkpointed per thread), so the system
        # message stays byte-identical and the agent's own prompt cache keeps working.
        self.freeze_per_thread = freeze_per_thread
        self.settings = settings if settings is not None else load_settings()
        self.agent_name = agent_name
        self.producer = producer if producer is not None else MemoryProducer(self.settings)
        self.injector = injector if injector is not None else MemoryInjector(self.settings)
        self.use_query = use_query

    # --- before the run: read memory once
    def _memory_block(self, user_id: str, state: MemoryState) -> dict[str, Any]:
        frozen = state.get(FROZEN_KEY) if self.freeze_per_thread else None
        if isinstance(frozen, str) and frozen:
            return {STATE_KEY: frozen}
        query = latest_user_text(state["messages"]) if self.use_query else None
        block = self.injector.block(user_id, self.agent_name, query=query)
        if self.freeze_per_thread and block:
            return {STATE_KEY: block, FROZEN_KEY: block}
        return {STATE_KEY: block}

    def before_agent(self, state: MemoryState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        return self._memory_block(require(runtime, "user_id"), state)

    async def abefore_agent(
        self, state: MemoryState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        user_id = require(runtime, "user_id")
        return await asyncio.to_thread(self._memory_block, user_id, state)

    # --- every model call of the run: add it to the system message
    @staticmethod
    def _with_block(request: ModelRequest[Any]) -> ModelRequest[Any]:
        block = request.state.get(STATE_KEY) if isinstance(request.state, Mapping) else None
        if not isinstance(block, str) or not block:
            return request
        return request.override(system_message=with_memory(request.system_message, block))

    def wrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], ModelResponse[Any]],
    ) -> ModelResponse[Any]:
        return handler(self._with_block(request))

    async def awrap_model_call(
        self,
        request: ModelRequest[Any],
        handler: Callable[[ModelRequest[Any]], Awaitable[ModelResponse[Any]]],
    ) -> ModelResponse[Any]:
        return await handler(self._with_block(request))

    # --- after the run: hand the conversation over
    def _hand_over(self, thread_id: str, user_id: str, messages: list[AnyMessage]) -> None:
        self.producer.after_agent(thread_id, user_id, self.agent_name, messages)

    def after_agent(self, state: MemoryState, runtime: Runtime[Any]) -> dict[str, Any] | None:
        thread_id, user_id = require(runtime, "thread_id"), require(runtime, "user_id")
        self._hand_over(thread_id, user_id, list(state["messages"]))
        return None

    async def aafter_agent(
        self, state: MemoryState, runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        thread_id, user_id = require(runtime, "thread_id"), require(runtime, "user_id")
        # The producer's call is bounded by its short Redis timeout, but it is still blocking.
        await asyncio.to_thread(self._hand_over, thread_id, user_id, list(state["messages"]))
        return None


_RUNTIME: contextvars.ContextVar[Runtime[Any] | None] = contextvars.ContextVar(
    "memq_summarization_runtime", default=None
)


class MemoryFlushingSummarization(SummarizationMiddleware):
    """LangChain's summarisation that first flushes to memq the messages it summarises away.

    Takes every argument of ``SummarizationMiddleware`` plus memq's ``settings``,
    ``agent_name`` and ``producer`` (share :attr:`MemoryMiddleware.producer`). The flush is
    fail-open and never stops the summary; a run without ids is summarised without a flush.
    """

    def __init__(
        self,
        model: Any,
        *,
        settings: MemqSettings | None = None,
        agent_name: str | None = None,
        producer: MemoryProducer | None = None,
        **summarization: Any,
    ) -> None:
        super().__init__(model, **summarization)
        if producer is None:
            producer = MemoryProducer(settings if settings is not None else load_settings())
        self.producer = producer
        self.agent_name = agent_name

    def before_model(self, state: AgentState[Any], runtime: Runtime[Any]) -> dict[str, Any] | None:
        token = _RUNTIME.set(runtime)
        try:
            return super().before_model(state, runtime)
        finally:
            _RUNTIME.reset(token)

    async def abefore_model(
        self, state: AgentState[Any], runtime: Runtime[Any]
    ) -> dict[str, Any] | None:
        token = _RUNTIME.set(runtime)
        try:
            return await super().abefore_model(state, runtime)
        finally:
            _RUNTIME.reset(token)

    def _flush(self, messages: list[AnyMessage]) -> None:
        runtime = _RUNTIME.get()
        thread_id, user_id = run_value(runtime, "thread_id"), run_value(runtime, "user_id")
        if thread_id is None or user_id is None:
            log.warning("memq: summarising a run without thread_id/user_id; nothing flushed")
            return
        self.producer.flush(thread_id, user_id, self.agent_name, messages)

    # Called with exactly the messages about to be replaced by the summary (LangChain 1.5).
    def _create_summary(self, messages_to_summarize: list[AnyMessage]) -> str:
        self._flush(messages_to_summarize)
        return super()._create_summary(messages_to_summarize)

    async def _acreate_summary(self, messages_to_summarize: list[AnyMessage]) -> str:
        # The flush is blocking (bounded by the producer's Redis timeout): off the event loop, so
        # the agent's other coroutines run meanwhile. to_thread copies the context, _RUNTIME too.
        await asyncio.to_thread(self._flush, messages_to_summarize)
        return await super()._acreate_summary(messages_to_summarize)
