from deerflow.agents.memory.manager import (
    MemoryCallbacks,
    MemoryConflictError,
    MemoryCorruptionError,
    MemoryManager,
    MemoryManagerError,
)

__all__ = [
    "MemoryCallbacks",
    "MemoryConflictError",
    "MemoryCorruptionError",
    "MemoryManager",
    "MemoryManagerError",
]
