"""Stand-in for ``deerflow.config.memory_config``: the ``memory:`` section of DeerFlow's
``config.yaml`` as the memory factory reads it, and the process-wide current value."""

from __future__ import annotations

import threading
from typing import Any, Literal

from pydantic import BaseModel, Field


class MemoryConfig(BaseModel):
    enabled: bool = True
    injection_enabled: bool = True
    manager_class: str = "deermem"
    mode: Literal["middleware", "tool"] = "middleware"
    backend_config: dict[str, Any] = Field(default_factory=dict)


_lock = threading.Lock()
_current = MemoryConfig()


def get_memory_config() -> MemoryConfig:
    with _lock:
        return _current


def set_memory_config(config: MemoryConfig) -> None:
    global _current
    with _lock:
        _current = config
