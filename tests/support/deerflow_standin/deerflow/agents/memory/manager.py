"""Stand-in for ``deerflow.agents.memory.manager`` at deer-flow f1f4af99b: the ``MemoryManager``
contract a backend subclasses, its construction invariants, its errors and the resolution of
``memory.manager_class``. Behaviour re-stated from the contract, not copied."""

from __future__ import annotations

import importlib
import threading
from abc import abstractmethod
from pathlib import Path
from typing import Any, ClassVar, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator


class MemoryCallbacks:
    def on_memory_llm_call(self, invoke_config: dict[str, Any], **kwargs: Any) -> None:
        pass

    def on_memory_llm_result(self, invoke_config: dict[str, Any], **kwargs: Any) -> None:
        pass


class MemoryManagerError(RuntimeError):
    pass


class MemoryConflictError(MemoryManagerError):
    pass


class MemoryCorruptionError(MemoryManagerError):
    pass


class MemoryManager(BaseModel):
    model_config = ConfigDict(arbitrary_types_allowed=True)

    backend_config: dict[str, Any] = Field(default_factory=dict)
    mode: Literal["middleware", "tool"] = "middleware"
    callbacks: MemoryCallbacks | None = None

    supports_search: ClassVar[bool] = False
    requires_passive_writes_in_tool_mode: ClassVar[bool] = False

    @field_validator("backend_config", mode="before")
    @classmethod
    def _none_is_empty(cls, value: Any) -> Any:
        return value or {}

    @model_validator(mode="after")
    def _check_invariants(self) -> MemoryManager:
        overridden = type(self).search is not MemoryManager.search
        if type(self).supports_search != overridden:
            raise ValueError(f"{type(self).__name__}.supports_search does not match search()")
        if self.mode == "tool" and not overridden:
            raise ValueError("memory mode='tool' requires a backend that implements search()")
        return self

    # tier 1
    @abstractmethod
    def add(
        self,
        thread_id: str,
        messages: list[Any],
        *,
        agent_name: str | None = None,
        user_id: str | None = None,
        trace_id: str | None = None,
    ) -> None: ...

    @abstractmethod
    def get_context(
        self, user_id: str | None, *, agent_name: str | None = None, thread_id: str | None = None
    ) -> str: ...

    @classmethod
    @abstractmethod
    def from_config(
        cls,
        backend_config: dict[str, Any],
        *,
        mode: Literal["middleware", "tool"] = "middleware",
        **host_hooks: Any,
    ) -> MemoryManager: ...

    # tier 2
    def add_nowait(
        self,
        thread_id: str,
        messages: list[Any],
        *,
        agent_name: str | None = None,
        user_id: str | None = None,
    ) -> None:
        self.add(thread_id, messages, agent_name=agent_name, user_id=user_id)

    def search(
        self,
        query: str,
        top_k: int = 5,
        *,
        user_id: str | None = None,
        agent_name: str | None = None,
        category: str | None = None,
    ) -> list[dict[str, Any]]:
        raise NotImplementedError("search")

    def get_memory(self, *, user_id: str | None = None, agent_name: str | None = None) -> Any:
        raise NotImplementedError("get_memory")

    def delete_memory(self, *, user_id: str | None = None, agent_name: str | None = None) -> None:
        raise NotImplementedError("delete_memory")

    def clear_memory(self, *, user_id: str | None = None, agent_name: str | None = None) -> Any:
        raise NotImplementedError("clear_memory")

    def import_memory(
        self,
        memory_data: dict[str, Any],
        *,
        user_id: str | None = None,
        agent_name: str | None = None,
    ) -> Any:
        raise NotImplementedError("import_memory")

    def export_memory(self, *, user_id: str | None = None, agent_name: str | None = None) -> Any:
        raise NotImplementedError("export_memory")

    def shutdown_flush(self, timeout: float) -> bool:
        return True

    # tier 3
    def warm(self) -> bool | None:
        return None

    def reload_memory(self, *, user_id: str | None = None, agent_name: str | None = None) -> Any:
        raise NotImplementedError("reload_memory")

    def create_fact(
        self,
        content: str,
        category: str = "context",
        confidence: float = 0.5,
        *,
        agent_name: str | None = None,
        user_id: str | None = None,
    ) -> tuple[dict[str, Any], str | None]:
        raise NotImplementedError("create_fact")

    def delete_fact(
        self, fact_id: str, *, agent_name: str | None = None, user_id: str | None = None
    ) -> dict[str, Any]:
        raise NotImplementedError("delete_fact")

    def update_fact(
        self,
        fact_id: str,
        content: str | None = None,
        category: str | None = None,
        confidence: float | None = None,
        *,
        agent_name: str | None = None,
        user_id: str | None = None,
    ) -> dict[str, Any]:
        raise NotImplementedError("update_fact")

    def on_pre_compress(self, messages: list[Any]) -> str:
        return ""

    def on_turn_start(self, turn_number: int, message: Any, **kwargs: Any) -> None:
        return None

    async def aadd(self, thread_id: str, messages: list[Any], **kwargs: Any) -> None:
        return self.add(thread_id, messages, **kwargs)

    async def aget_context(self, user_id: str | None, **kwargs: Any) -> str:
        return self.get_context(user_id, **kwargs)

    async def asearch(self, query: str, top_k: int = 5, **kwargs: Any) -> list[dict[str, Any]]:
        return self.search(query, top_k, **kwargs)

    def close(self) -> None:
        return None


def resolve_manager_class(manager_class: str) -> type[MemoryManager]:
    """``pkg.mod:Cls`` or ``pkg.mod.Cls`` → a MemoryManager subclass; anything else is a startup
    error (DeerFlow never falls back silently to another backend)."""
    if ":" in manager_class:
        module_path, _, attr = manager_class.partition(":")
    else:
        module_path, _, attr = manager_class.rpartition(".")
    cls = getattr(importlib.import_module(module_path), attr, None)
    if not (isinstance(cls, type) and issubclass(cls, MemoryManager)):
        raise ValueError(f"memory.manager_class={manager_class!r} is not a MemoryManager")
    return cls


def _host_storage_path(config: dict[str, Any]) -> str:
    """DeerFlow's rule for ``storage_path``: none → its state folder; relative → under it."""
    from deerflow.config.runtime_paths import runtime_home

    given = config.get("storage_path")
    if not given:
        return str(runtime_home())
    if not Path(str(given)).is_absolute():
        return str((runtime_home() / str(given)).resolve())
    return str(given)


_manager: MemoryManager | None = None
_manager_lock = threading.Lock()


def get_memory_manager() -> MemoryManager:
    """The process's one manager, built on first use from the current ``MemoryConfig`` (double
    checked under a lock, as DeerFlow's threads all reach here)."""
    global _manager
    if _manager is not None:
        return _manager
    with _manager_lock:
        if _manager is None:
            from deerflow.config.memory_config import get_memory_config

            config = get_memory_config()
            backend_config = dict(config.backend_config or {})
            backend_config["storage_path"] = _host_storage_path(backend_config)
            cls = resolve_manager_class(config.manager_class)
            _manager = cls.from_config(backend_config, mode=config.mode)
        return _manager


def reset_memory_manager() -> None:
    """Forget the cached manager (DeerFlow calls it on config reloads; tests between cases)."""
    global _manager
    with _manager_lock:
        _manager = None


def build_memory_manager(
    manager_class: str,
    backend_config: dict[str, Any],
    *,
    mode: Literal["middleware", "tool"] = "middleware",
    storage_path: str,
    host_hooks: dict[str, Any] | None = None,
) -> MemoryManager:
    """What ``get_memory_manager()`` does once per process: resolve the class, inject a
    ``storage_path`` when the config has none, and call ``from_config`` with the host hooks."""
    cls = resolve_manager_class(manager_class)
    config = dict(backend_config)
    if not config.get("storage_path"):
        config["storage_path"] = storage_path
    return cls.from_config(config, mode=mode, **(host_hooks or {}))
