"""The spool kept on disk, for producers whose process may end during an outage.

Layout: ``<folder>/prefix-<key prefix>/<owner>/<sha256 of the context id>.json``, one file per
spooled context (written to a temporary name, then renamed: a kill never leaves half a file),
folders 0700 and files 0600 (they hold conversations). Each process writes only its own
``<owner>`` folder and holds an exclusive ``flock`` on its ``lock`` file while it lives. A process
that starts adopts every sibling folder whose lock it can take (its owner ended, however it
ended): it reads those entries into its own spool, oldest first, and replays them as soon as
Redis answers. Entries survive the process, not a power loss (no fsync: the spool is on the
agent's path).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import logging
import os
import time
import uuid
from pathlib import Path
from typing import Any

from memq.core.identity import ContextKey
from memq.core.settings import MemqSettings
from producer.enqueue import EnqueueRequest
from producer.spool import Spool

log = logging.getLogger("producer.producer")

_FORMAT = 1
_LOCK = "lock"


def open_spool(settings: MemqSettings) -> Spool:
    """The spool the settings ask for: on disk in ``settings.spool_folder`` when there is one
    (in memory, with a warning, when that folder cannot be used), else in memory."""
    folder = settings.spool_folder
    if folder is None:
        return Spool(settings.spool_max_contexts, settings.spool_max_bytes)
    try:
        return DiskSpool(
            folder / f"prefix-{settings.key_prefix}",
            settings.spool_max_contexts,
            settings.spool_max_bytes,
        )
    except OSError as exc:
        log.warning(
            "memq: cannot keep the spool in %s (%s); a turn spooled now is lost if this process "
            "ends before Redis is back",
            folder,
            exc.strerror or type(exc).__name__,
        )
        return Spool(settings.spool_max_contexts, settings.spool_max_bytes)


def _private_dir(path: Path) -> None:
    path.mkdir(mode=0o700, parents=True, exist_ok=True)
    os.chmod(path, 0o700)


def _entry_name(context_id: str) -> str:
    return hashlib.sha256(context_id.encode("utf-8")).hexdigest()[:32] + ".json"


def _encode(request: EnqueueRequest, order: int) -> str:
    key = request.key
    return json.dumps(
        {
            "format": _FORMAT,
            "order": order,
            "thread_id": key.thread_id,
            "user_id": key.user_id,
            "agent_name": key.agent_name,
            "messages_json": request.messages_json,
            "flush": request.flush,
            "trace_id": request.trace_id,
            "captured_ms": request.captured_ms,
            "failures": request.failures,
            "max_bytes": request.max_bytes,
        },
        ensure_ascii=False,
    )


def _decode(text: str) -> tuple[int, EnqueueRequest]:
    data: Any = json.loads(text)
    if not isinstance(data, dict) or data.get("format") != _FORMAT:
        raise ValueError("not a spool entry of this version")
    # Validated again: the file sits on disk between two processes.
    key = ContextKey.create(data["thread_id"], data["user_id"], data["agent_name"])
    request = EnqueueRequest(
        key=key,
        messages_json=str(data["messages_json"]),
        flush=bool(data["flush"]),
        trace_id=data["trace_id"] if isinstance(data["trace_id"], str) else None,
        captured_ms=int(data["captured_ms"]) if data["captured_ms"] is not None else None,
        failures=int(data["failures"]),
        max_bytes=int(data["max_bytes"]) if data["max_bytes"] is not None else None,
    )
    return int(data["order"]), request


class DiskSpool(Spool):
    """A :class:`Spool` whose every entry is also a file in this process's own folder."""

    def __init__(self, root: Path, max_contexts: int, max_bytes: int | None = None) -> None:
        super().__init__(max_contexts, max_bytes)
        _private_dir(root)
        self.folder = root
        self._own = root / f"{os.getpid()}-{uuid.uuid4().hex[:8]}"
        _private_dir(self._own)
        self._lock_fd: int | None = os.open(self._own / _LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        fcntl.flock(self._lock_fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        self._order: dict[str, int] = {}
        self._back = time.time_ns()
        self._front = self._back
        self._write_failed = False
        self.adopted = self._adopt_orphans(root)

    def holds(self, context_id: str) -> bool:
        """Whether the context is on disk (what a door may promise survives this process)."""
        with self._lock:
            return context_id in self._order

    def close(self) -> None:
        """Release the folder: the next process started with it adopts what is left."""
        with self._lock:
            fd, self._lock_fd = self._lock_fd, None
            if fd is None:
                return
            if not self._order:  # nothing left: leave no empty folder behind
                with contextlib.suppress(OSError):
                    (self._own / _LOCK).unlink()
                    self._own.rmdir()
            os.close(fd)

    # --- adoption of what ended processes left
    def _adopt_orphans(self, root: Path) -> int:
        entries: list[tuple[int, EnqueueRequest]] = []
        for folder in sorted(p for p in root.iterdir() if p.is_dir() and p != self._own):
            entries.extend(self._take_folder(folder))
        entries.sort(key=lambda entry: entry[0])
        dropped = 0
        for order, request in entries:
            self._back = max(self._back, order)
            dropped += self.put(request)
        if entries:
            log.warning(
                "memq: %d spooled contexts left by an ended process adopted from %s%s",
                len(entries),
                root,
                f" ({dropped} dropped: the spool is full)" if dropped else "",
            )
        return len(entries)

    def _take_folder(self, folder: Path) -> list[tuple[int, EnqueueRequest]]:
        """The entries of a folder whose owner has ended (its lock is free), removed from it;
        nothing when its owner is alive."""
        try:
            fd = os.open(folder / _LOCK, os.O_RDWR | os.O_CREAT, 0o600)
        except OSError:
            return []
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return []  # a live process's spool
            entries: list[tuple[int, EnqueueRequest]] = []
            for path in folder.glob("*.json"):
                try:
                    entries.append(_decode(path.read_text(encoding="utf-8")))
                except (OSError, ValueError, KeyError, TypeError) as exc:
                    # Never the content: it is a conversation.
                    log.warning(
                        "memq: unreadable spool entry %s skipped (%s)", path, type(exc).__name__
                    )
            for path in [*folder.glob("*.json"), *folder.glob(".*.tmp"), folder / _LOCK]:
                path.unlink(missing_ok=True)
            folder.rmdir()
            return entries
        except OSError:
            return []
        finally:
            os.close(fd)

    # --- the hooks of Spool, called under its lock
    def _keep(self, context_id: str, request: EnqueueRequest, *, first: bool) -> None:
        if first:
            self._front -= 1
            order = self._front
        elif context_id in self._order and next(reversed(self._items)) != context_id:
            order = self._order[context_id]  # merged in place
        else:
            self._back = max(self._back + 1, time.time_ns())
            order = self._back
        path = self._own / _entry_name(context_id)
        temporary = path.with_name(f".{path.name}.tmp")
        try:
            fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
            with os.fdopen(fd, "w", encoding="utf-8") as file:
                file.write(_encode(request, order))
            os.replace(temporary, path)
        except OSError as exc:
            self._order.pop(context_id, None)
            if not self._write_failed:
                self._write_failed = True
                log.warning(
                    "memq: cannot write the spool in %s (%s); spooling in memory only",
                    self._own,
                    exc.strerror or type(exc).__name__,
                )
            return
        self._order[context_id] = order

    def _forget(self, context_id: str) -> None:
        if self._order.pop(context_id, None) is None:
            return
        try:
            (self._own / _entry_name(context_id)).unlink(missing_ok=True)
        except OSError as exc:
            log.warning("memq: cannot remove a sent spool entry (%s)", type(exc).__name__)
