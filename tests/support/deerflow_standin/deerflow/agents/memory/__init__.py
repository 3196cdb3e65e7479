from deerflow.agents.memory.manager import (
    MemoryCallbacks,
    MemoryConflictError,
    MemoryCorruptionError,
    MemoryManager,
    MemoryManagerError,
    get_memory_manager,
    reset_memory_manager,
)

__all__ = [
    "MemoryCallbacks",
    "MemoryConflictError",
    "MemoryCorruptionError",
    "MemoryManager",
    "MemoryManagerError",
    "get_memory_manager",
    "reset_memory_manager",
]
