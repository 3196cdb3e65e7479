"""What agent processes import: the producer hook and the memory injector.

Imports are lazy so that an agent importing one never pays for the other (and never loads Celery or
the LLM client, which live in `worker/`).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from producer.injector import MemoryInjector
    from producer.producer import MemoryProducer

__all__ = ["MemoryInjector", "MemoryProducer"]


def __getattr__(name: str) -> Any:
    if name == "MemoryProducer":
        from producer.producer import MemoryProducer

        return MemoryProducer
    if name == "MemoryInjector":
        from producer.injector import MemoryInjector

        return MemoryInjector
    raise AttributeError(f"module 'producer' has no attribute {name!r}")
