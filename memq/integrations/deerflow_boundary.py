"""What crosses the DeerFlow boundary besides documents: the ``backend_config`` as memq settings,
the arguments of the fact calls, and memq's errors as the ones DeerFlow's callers act on.

DeerFlow's gateway maps ``MemoryConflictError`` to 409 and ``MemoryCorruptionError`` to 500, and
its ``failure_policy.read: fail_closed`` re-raises only ``MemoryManagerError`` (any other error
of a read is swallowed as "no memory"): a failed read must therefore reach DeerFlow as one.
"""

from __future__ import annotations

import contextlib
import logging
import os
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import redis
from deerflow.agents.memory.manager import (
    MemoryConflictError,
    MemoryCorruptionError,
    MemoryManagerError,
)

from memq.core.errors import (
    CorruptMemoryFile,
    InvalidMemoryData,
    LockTimeout,
    RedisUnavailable,
    StorageError,
)
from memq.core.settings import MemqSettings, load_settings
from memq.core.settings_sources import settings_values
from storage.backends import backend_for
from storage.fact_input import valid_confidence, valid_content

log = logging.getLogger("memq.integrations.deerflow")


class DuplicateFactError(MemoryConflictError, ValueError):
    """A fact with the same content exists: 409 at the gateway, an ``error`` for the tool."""


def settings_for(backend_config: Mapping[str, Any]) -> MemqSettings:
    """memq's settings from a DeerFlow ``backend_config`` (memq's names or DeerFlow's) and the
    environment.

    The folder, most explicit first: ``storage_dir`` in the config, then ``MEMQ_STORAGE_DIR``
    (what the workers read too), then ``memq/`` inside the ``storage_path`` DeerFlow injects
    (its home holds DeerFlow's own ``users/*/memory.json``: memq's files go beside them). A path
    that is an existing file is refused here, once, rather than failing every later call.
    """
    values = settings_values(backend_config)
    values.pop("storage_dir", None)  # settings_values renames storage_path; decided below
    given_path = backend_config.get("storage_path")
    for name in ("storage_dir", "storage_path"):
        # Whatever the backend: DeerFlow treats a file there as a configuration error.
        if backend_config.get(name) is not None:
            _not_a_file(Path(str(backend_config[name])).expanduser(), name)
    if backend_config.get("storage_dir") is not None:
        values["storage_dir"], source = backend_config["storage_dir"], "storage_dir"
    elif _in_environment("storage_dir"):
        source = "MEMQ_STORAGE_DIR"
    elif given_path:
        values["storage_dir"], source = Path(str(given_path)).expanduser() / "memq", "storage_path"
    else:
        source = "storage_dir"
    ignored = sorted(set(values) - set(MemqSettings.model_fields))
    if ignored:
        # DeerMem's own knobs (model, patterns_dir, storage_class, …) mean nothing to memq.
        log.info("memq: backend_config keys without a memq setting, ignored: %s", ignored)
    settings = load_settings(**values)
    folder = backend_for(settings).folder(settings)
    if folder is not None:
        _usable_folder(folder, source)
    return settings


def _in_environment(field: str) -> bool:
    """Whether the environment sets this setting (names are case-insensitive, as for memq)."""
    name = f"MEMQ_{field}".upper()
    return any(key.upper() == name for key in os.environ)


def _not_a_file(path: Path, name: str) -> None:
    try:
        is_file = path.is_file()
    except (OSError, ValueError):
        return  # not a file; whether it is usable is checked where it is used
    if is_file:
        raise ValueError(f"memq: {name} {str(path)[:200]!r} is an existing file, not a folder")


def _usable_folder(folder: Path, name: str) -> None:
    """The file store's folder exists (created 0700 when missing) and is a folder: checked once
    at construction, so a bad path is one clear error at startup, not an OSError on every call."""
    for path in (folder, *folder.parents):
        _not_a_file(path, name)
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
    except (OSError, ValueError) as exc:
        reason = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise ValueError(
            f"memq: {name} {str(folder)[:200]!r} is not a usable folder: {reason}"
        ) from None


@contextlib.contextmanager
def management_errors() -> Iterator[None]:
    """memq's errors as the ones DeerFlow's gateway maps to status codes."""
    try:
        yield
    except CorruptMemoryFile as exc:
        raise MemoryCorruptionError(str(exc)) from exc
    except LockTimeout as exc:
        raise MemoryConflictError(str(exc)) from exc
    except redis.RedisError as exc:
        raise OSError(f"memq: Redis error: {exc}") from exc


@contextlib.contextmanager
def read_errors(what: str) -> Iterator[None]:
    """A read that fails (Redis away or timing out, storage unreadable, a corrupt document) as
    DeerFlow's ``MemoryManagerError``, so ``fail_closed`` can act on it and ``fail_open`` logs
    it. Bad arguments (an invalid id) stay what they are."""
    try:
        yield
    except MemoryManagerError:
        raise
    except CorruptMemoryFile as exc:
        raise MemoryCorruptionError(f"memq: {what}: {exc}") from exc
    except (RedisUnavailable, StorageError, redis.RedisError, OSError) as exc:
        # The type names the failure; Redis' and the OS's messages hold no user text.
        raise MemoryManagerError(f"memq: {what} failed: {type(exc).__name__}: {exc}") from exc


def fact_content(value: object) -> str:
    try:
        return valid_content(value)
    except InvalidMemoryData:
        raise ValueError("content") from None


def fact_confidence(value: object) -> float:
    try:
        return valid_confidence(value)
    except InvalidMemoryData:
        raise ValueError("confidence") from None
