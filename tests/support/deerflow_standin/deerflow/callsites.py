"""How DeerFlow (f1f4af99b) calls a memory backend: the after-agent middleware, the
pre-summarisation hook, the injection wrapper, the memory tools and the gateway's error mapping.
Re-stated from DeerFlow's call sites, reduced to what the backend can observe."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from deerflow.agents.memory.manager import (
    MemoryConflictError,
    MemoryCorruptionError,
    MemoryManager,
    MemoryManagerError,
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


def memory_context(
    manager: MemoryManager,
    user_id: str,
    agent_name: str | None,
    *,
    failure_policy: Mapping[str, str] | None = None,
) -> str:
    """``_get_memory_context``: the backend's text wrapped in ``<memory>``. Errors become "",
    except a ``MemoryManagerError`` when the backend config says ``failure_policy.read:
    fail_closed`` (then the run fails instead of going on without memory)."""
    try:
        content = manager.get_context(user_id, agent_name=agent_name)
    except Exception as exc:
        closed = (failure_policy or {}).get("read") == "fail_closed"
        if closed and isinstance(exc, MemoryManagerError):
            raise
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


def delete_custom_agent(
    manager: MemoryManager, agents_root: Path, *, user_id: str, agent_name: str
) -> int | None:
    """``DELETE /api/agents/{name}``: the agent's folder goes, then the manager's optional
    ``discard_pending_updates`` hook (probed with ``getattr``) drops what the backend still holds
    for that agent. Returns the hook's count, None when the backend has no hook."""
    folder = agents_root / "users" / user_id / "agents" / agent_name
    if not (folder / "config.yaml").is_file():
        raise FileNotFoundError(agent_name)
    shutil.rmtree(folder)
    discard = getattr(manager, "discard_pending_updates", None)
    if not callable(discard):
        return None
    count: int = discard(user_id=user_id, agent_name=agent_name)
    return count


def lifespan_startup(manager: MemoryManager) -> str:
    """The gateway's start: ``warm()``; a failure is logged and the gateway starts anyway.
    Returns what it would log: "skipped", "warmed", "failed" or "error"."""
    try:
        warmed = manager.warm()
    except Exception:
        return "error"
    if warmed is None:
        return "skipped"
    return "warmed" if warmed else "failed"


def lifespan_shutdown(manager: MemoryManager, timeout: float) -> bool:
    """The gateway's stop: a bounded ``shutdown_flush``, then ``close()`` whatever happened."""
    try:
        return manager.shutdown_flush(timeout)
    except Exception:
        return False
    finally:
        manager.close()
