"""The storage backends, each describing itself once: the CLI, `memq doctor`, `memq up`, the
injector and the DeerFlow backend read these descriptions instead of branching on a name.

Adding a backend is one entry in :data:`BACKENDS` (plus its module, and its name in the
``storage`` setting's choices); the storage contract suite (``tests/test_storage_contract.py``)
then runs against it as it runs against the others.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Final

from memq.core.redis_urls import mask_url
from memq.core.settings import MemqSettings

if TYPE_CHECKING:
    from memq.core.connection import RedisClient
    from storage.base import MemoryStorage

# Builds a backend from the settings and the deployment's Redis client (None: the backend builds
# its own from the settings when it first needs one). The client has one meaning for every
# backend: the Redis of this deployment, the one its queue and claims live in.
Factory = Callable[[MemqSettings, "RedisClient | None"], "MemoryStorage"]


@dataclass(frozen=True, slots=True)
class Backend:
    """One storage backend, as operators and callers need to know it."""

    name: str  # the value of MEMQ_STORAGE
    where: Callable[[MemqSettings], str]  # where the documents live, for people
    shared_across_hosts: bool  # every process that reaches the same Redis sees the same memory
    claims_checked_against: str  # what a fenced save checks the run's claim against
    reads_from_redis: bool  # a read is a Redis round trip (the injector gives it a short timeout)
    folder: Callable[[MemqSettings], Path | None]  # the local folder it writes, if any
    open: Factory


def _redis(settings: MemqSettings, client: RedisClient | None) -> MemoryStorage:
    from storage.redis_store import RedisMemoryStorage

    return RedisMemoryStorage(settings, client)


def _file(settings: MemqSettings, client: RedisClient | None) -> MemoryStorage:
    from storage.fencing import RedisClaimCheck
    from storage.files import FileMemoryStorage

    return FileMemoryStorage(settings, claim_check=RedisClaimCheck(settings, client))


def _redis_where(settings: MemqSettings) -> str:
    return f"in Redis at {mask_url(settings.redis_url)}"


BACKENDS: Final[dict[str, Backend]] = {
    backend.name: backend
    for backend in (
        Backend(
            name="redis",
            where=_redis_where,
            shared_across_hosts=True,
            claims_checked_against="the context's claim token, read by the save script itself",
            reads_from_redis=True,
            folder=lambda settings: None,
            open=_redis,
        ),
        Backend(
            name="file",
            where=lambda settings: f"in files under {settings.storage_dir}",
            shared_across_hosts=False,
            claims_checked_against=(
                "the context's claim token in Redis, read under the document lock before the write"
            ),
            reads_from_redis=False,
            folder=lambda settings: settings.storage_dir,
            open=_file,
        ),
    )
}


def backend_for(settings: MemqSettings) -> Backend:
    """The backend ``settings.storage`` names."""
    return BACKENDS[settings.storage]
