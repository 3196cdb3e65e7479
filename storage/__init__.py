"""Where memory documents live: the document model, the storage protocol and its two backends."""

from __future__ import annotations

from typing import TYPE_CHECKING

from memq.core.settings import MemqSettings, load_settings
from storage.base import Change, Fence, MemoryStorage, UpdateResult
from storage.document import Fact, MemoryDocument

if TYPE_CHECKING:
    from memq.core.connection import RedisClient

__all__ = [
    "Change",
    "Fact",
    "Fence",
    "MemoryDocument",
    "MemoryStorage",
    "UpdateResult",
    "get_storage",
]


def get_storage(
    settings: MemqSettings | None = None, *, redis: RedisClient | None = None
) -> MemoryStorage:
    """The backend ``settings.storage`` names (``redis``, the default, or ``file``; see
    :mod:`storage.backends`).

    ``redis`` is the deployment's Redis client to share, whatever the backend: the Redis backend
    keeps the documents in it, the file backend checks fenced saves' claims against it. Without
    one, the backend builds its own from the settings when it first needs it. Settings come from
    the environment when omitted.
    """
    from storage.backends import backend_for

    settings = settings or load_settings()
    return backend_for(settings).open(settings, redis)
