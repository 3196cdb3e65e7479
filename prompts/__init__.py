"""Text in and out of the update model: the update prompt, conversation rendering, escaping, the
answer schema and its tolerant parser, token counting, and the injected memory block."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prompts.injection import format_memory_for_injection

__all__ = ["format_memory_for_injection"]


def __getattr__(name: str) -> Any:
    if name == "format_memory_for_injection":
        from prompts.injection import format_memory_for_injection

        return format_memory_for_injection
    raise AttributeError(f"module 'prompts' has no attribute {name!r}")
