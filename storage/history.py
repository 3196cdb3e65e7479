"""How both storage backends encode what they keep: the document text and the change history.

Shared so a document written by the file backend can be imported into Redis byte for byte, and so
a history entry means the same thing whichever backend wrote it.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import uuid
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from storage.base import Change, UpdateResult
from storage.document import MemoryDocument, copy_document, utc_now
from storage.private import append_private, write_private
from storage.vectors import pruned

log = logging.getLogger(__name__)


class DocumentDecodeError(ValueError):
    """Stored text is not a memory document (each backend maps it to CorruptMemoryFile)."""


def dump_document(document: MemoryDocument) -> str:
    """memory.json text: UTF-8, 2-space indent, non-ASCII kept as is (DeerFlow's layout)."""
    # pydantic's serialiser writes the same text as json.dumps(indent=2) about 6x faster
    return document.model_dump_json(indent=2) + "\n"


def parse_document(text: str | bytes) -> MemoryDocument:
    """Parse stored text; anything but a JSON object that validates is an error, never "empty"."""
    try:
        data: Any = json.loads(text)
    except ValueError as exc:
        raise DocumentDecodeError(f"not JSON: {exc}") from exc
    if not isinstance(data, dict):
        raise DocumentDecodeError(f"the top level is a {type(data).__name__}, not an object")
    try:
        return MemoryDocument.model_validate(data)
    except ValidationError as exc:
        raise DocumentDecodeError(f"not a memory document: {exc}") from exc


def stamp_for_save(document: MemoryDocument) -> MemoryDocument:
    """A private copy with ``last_updated`` set and the vectors of texts no fact says any more
    dropped (every backend saves through here, so a forgotten fact never keeps its vector); the
    caller's object is never mutated."""
    copy = copy_document(document)
    copy.last_updated = utc_now()
    if copy.embeddings:
        copy.embeddings = pruned(copy.embeddings, (f.content for f in copy.facts))
    return copy


def split_update_result(
    value: MemoryDocument | UpdateResult,
) -> tuple[MemoryDocument, list[Change]]:
    """What an ``update`` callback returned → (document, changes to record)."""
    if isinstance(value, UpdateResult):
        return value.document, list(value.changes)
    if isinstance(value, MemoryDocument):
        return value, []
    raise TypeError(
        f"an update callback must return a MemoryDocument or UpdateResult, not {type(value)!r}"
    )


def encode_change(change: Change) -> str:
    """One history entry as a single line of JSON."""
    return change.model_dump_json(exclude_none=True)


def decode_changes(lines: Iterable[str | bytes]) -> list[Change]:
    """Entries in stored order; a damaged line is skipped (history is an audit aid, not data)."""
    changes: list[Change] = []
    for line in lines:
        if not line.strip():
            continue
        try:
            changes.append(Change.model_validate_json(line))
        except ValidationError:
            log.warning("skipping an unreadable memory history entry: %.120r", line)
    return changes


def bounded(changes: list[Change], limit: int) -> list[Change]:
    """The newest ``limit`` entries, oldest first (``limit`` 0 keeps none)."""
    return changes[-limit:] if limit > 0 else []


def newest_first(changes: list[Change], limit: int) -> list[Change]:
    """The last ``limit`` entries, newest first (how `history()` answers on every backend)."""
    if limit <= 0:
        return []
    return list(reversed(changes[-limit:]))


def write_history_file(path: Path, changes: list[Change]) -> None:
    """Replace a history file whole (atomically: a reader sees the old or the new one)."""
    tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
    try:
        write_private(tmp, "".join(encode_change(c) + "\n" for c in changes).encode("utf-8"))
        os.replace(tmp, path)
    finally:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()


def read_history_file(path: Path) -> list[Change]:
    """A history file's entries, oldest first ([] when there is none)."""
    try:
        return decode_changes(path.read_bytes().splitlines())
    except FileNotFoundError:
        return []


def append_history_file(path: Path, changes: list[Change], bound: int) -> None:
    """Append ``changes`` (the caller holds the document's lock), then trim to the newest
    ``bound`` entries by an atomic rewrite; 0 keeps no history. A failure is logged: the
    document is saved, losing an audit line must not fail the update."""
    if not changes or bound == 0:
        return
    lines = "".join(encode_change(c) + "\n" for c in changes).encode("utf-8")
    try:
        append_private(path, lines)
        kept = path.read_bytes().splitlines(keepends=True)
        if len(kept) > bound:
            tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
            try:
                write_private(tmp, b"".join(kept[-bound:]))
                os.replace(tmp, path)
            finally:
                with contextlib.suppress(FileNotFoundError):
                    tmp.unlink()
    except OSError as exc:
        log.warning("could not record memory history in %s: %s", path, exc)
