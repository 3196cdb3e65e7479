"""The file backend's fence file: beside each memory.json, the newest claim that extracted into it.

``memory.fence.json`` maps a context id to the highest claim epoch that has extracted into this
document (the fencing value: it only moves forward). It is read and written under the document's
lock, so these functions take no lock of their own.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import uuid
from pathlib import Path

from memq.core.errors import StaleClaim, StorageError
from storage.base import Fence
from storage.private import write_private

# The file backend's logger: operators filter on it, and the fence file is part of that backend.
log = logging.getLogger("storage.files")

FENCE_NAME = "memory.fence.json"
FENCE_MAX_ENTRIES = 1000  # threads remembered per document; the oldest claims are dropped first


def check_fence(fences: dict[str, int], fence: Fence) -> None:
    """Raise :class:`StaleClaim` when a newer claim of ``fence``'s context already wrote here."""
    newest = fences.get(fence.context_id, 0)
    if newest > fence.epoch:
        raise StaleClaim(
            f"claim {fence.token} of {fence.context_id} was overtaken by claim {newest}; not saved"
        )


def read_fences(directory: Path) -> dict[str, int]:
    try:
        raw = json.loads((directory / FENCE_NAME).read_bytes())
    except FileNotFoundError:
        return {}
    except (OSError, ValueError) as exc:
        # A lost fence file only loses ordering, never data: start over, loudly.
        log.warning("unreadable fence file in %s (%s); starting a new one", directory, exc)
        return {}
    if not isinstance(raw, dict):
        return {}
    return {str(k): int(v) for k, v in raw.items() if isinstance(v, int)}


def write_fences(directory: Path, fences: dict[str, int]) -> None:
    if len(fences) > FENCE_MAX_ENTRIES:
        kept = sorted(fences.items(), key=lambda item: item[1])[-FENCE_MAX_ENTRIES:]
        fences = dict(kept)
    path = directory / FENCE_NAME
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        write_private(tmp, json.dumps(fences, separators=(",", ":")).encode("utf-8"))
        os.replace(tmp, path)
    except OSError as exc:
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise StorageError(f"cannot write {path}: {exc}") from exc
