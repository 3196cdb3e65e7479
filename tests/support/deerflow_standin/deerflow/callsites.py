"""How DeerFlow (f1f4af99b) calls a memory backend: the after-agent middleware, the
pre-summarisation hook, the injection wrapper, the memory tools and the gateway's error mapping.
Re-stated from DeerFlow's call sites, reduced to what the backend can observe."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from deerflow.agents.memory.manager import (
    MemoryConflictError,
    MemoryCorruptionError,
    MemoryManager,
)


def after_agent(
    manager: MemoryManager,
    thread_id: str,
    messages: list[Any],
    *,
    agent_name: str | None,
    user_id: str,
    trace_id: str | None = None,
) -> None:
    """``MemoryMiddleware.after_agent``: the run's whole ``state["messages"]``."""
    if not thread_id or not messages:
        return
    manager.add(thread_id, messages, agent_name=agent_name, user_id=user_id, trace_id=trace_id)


def summarization_flush(
    manager: MemoryManager,
    thread_id: str,
    messages_to_summarize: list[Any],
    *,
    agent_name: str | None,
    user_id: str,
) -> None:
    """``memory_flush_hook``: synchronously, before the messages are removed."""
    manager.add_nowait(
        thread_id, list(messages_to_summarize), agent_name=agent_name, user_id=user_id
    )


def memory_context(manager: MemoryManager, user_id: str, agent_name: str | None) -> str:
    """``_get_memory_context``: the backend's text wrapped in ``<memory>``; errors become ""."""
    try:
        content = manager.get_context(user_id, agent_name=agent_name)
    except Exception:
        return ""
    if not content.strip():
        return ""
    return f"<memory>\n{content}\n</memory>\n"


def memory_search_tool(
    manager: MemoryManager,
    query: str,
    *,
    user_id: str,
    agent_name: str | None,
    category: str | None = None,
    limit: int = 10,
) -> str:
    try:
        results = manager.search(
            query, top_k=limit, user_id=user_id, agent_name=agent_name, category=category
        )
        return json.dumps({"results": results, "count": len(results)}, ensure_ascii=False)
    except Exception as exc:
        return json.dumps({"error": str(exc)})


def gateway(call: Callable[[], Any]) -> tuple[int, Any]:
    """Run one manager call the way the memory router does; (status, body or detail)."""
    try:
        result = call()
    except NotImplementedError:
        return 501, "not supported"
    except ValueError as exc:
        if exc.args and exc.args[0] == "confidence":
            return 400, "Invalid confidence value; must be between 0 and 1."
        if exc.args and exc.args[0] == "Duplicate fact":
            return 409, "A fact with the same content already exists."
        return 400, "Memory fact content cannot be empty."
    except KeyError:
        return 404, "Memory fact not found."
    except MemoryConflictError:
        return 409, "Memory changed concurrently; reload and retry."
    except MemoryCorruptionError:
        return 500, "Stored memory data is corrupted."
    except OSError:
        return 500, "Failed."
    if isinstance(result, tuple):
        document, fact_id = result
        if fact_id is None:
            return 409, "Fact was not stored because max_facts evicted it"
        return 200, document
    return 200, result
