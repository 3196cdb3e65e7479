"""memq: long-term user memory for LLM agents.

``from memq import MemoryProducer, MemoryInjector`` is all an agent needs. This module stays light:
nothing here imports Celery, the LLM client or tiktoken.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from memq.core.settings import MemqSettings
    from producer.injector import MemoryInjector
    from producer.producer import MemoryProducer

__all__ = ["MemoryInjector", "MemoryProducer", "MemqSettings", "__version__"]
__version__ = "0.1.0"


def __getattr__(name: str) -> Any:
    if name == "MemoryProducer":
        from producer.producer import MemoryProducer

        return MemoryProducer
    if name == "MemoryInjector":
        from producer.injector import MemoryInjector

        return MemoryInjector
    if name == "MemqSettings":
        from memq.core.settings import MemqSettings

        return MemqSettings
    raise AttributeError(f"module 'memq' has no attribute {name!r}")
