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
    """The backend ``settings.storage`` names (``redis``, the default, or ``file``).

    ``redis`` is an existing client to share (Redis backend only); without it one is built from the
    settings. Settings come from the environment when omitted.
    """
    settings = settings or load_settings()
    if settings.storage == "redis":
        from storage.redis_store import RedisMemoryStorage

        return RedisMemoryStorage(settings, redis)
    from storage.files import FileMemoryStorage

    if redis is None:
        return FileMemoryStorage(settings)
    from storage.fencing import RedisClaimCheck

    return FileMemoryStorage(settings, claim_check=RedisClaimCheck(settings, redis))
