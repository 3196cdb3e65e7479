"""The file backend (``MEMQ_STORAGE=file``): one memory.json per (user, agent) on this host.

Layout under ``settings.storage_dir``::

    users/<user>/memory.json                       user-global memory (agent None)
    users/<user>/memory.history.jsonl              its change history
    users/<user>/memory.json.lock                  the cross-process lock (fcntl)
    users/<user>/agents/<agent>/memory.json        memory of one agent of that user

Fixes DeerFlow's weak points: writes are atomic and durable (unique temp file, fsync of
the file and of its folder), updates are serialised across processes by an fcntl lock, the read
cache never hands out a shared object, and a corrupt file is moved aside and reported, never read as
empty and then overwritten.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import uuid
from collections import OrderedDict
from collections.abc import Callable, Iterator
from pathlib import Path

from memq.core.errors import CorruptMemoryFile, LockTimeout, StaleClaim, StorageError
from memq.core.identity import (
    decode_segment,
    decode_user,
    encode_agent,
    encode_user,
    validate_agent_name,
    validate_user_id,
)
from memq.core.settings import MemqSettings
from storage.base import Change, Fence, RewriteFn, UpdateFn
from storage.document import MemoryDocument, copy_document, empty_document, utc_now
from storage.fence_file import FENCE_NAME, check_fence, read_fences, write_fences
from storage.filelock import acquire_flock
from storage.history import (
    DocumentDecodeError,
    append_history_file,
    bounded,
    decode_changes,
    dump_document,
    newest_first,
    parse_document,
    read_history_file,
    split_update_result,
    stamp_for_save,
    write_history_file,
)
from storage.private import write_private

log = logging.getLogger(__name__)

DOCUMENT_NAME = "memory.json"
HISTORY_NAME = "memory.history.jsonl"
LOCK_NAME = "memory.json.lock"
CORRUPT_PREFIX = "memory.json.corrupt-"

# (device, inode, size, mtime ns, ctime ns): every replace makes a new inode, so a coarse mtime
# alone can no longer serve a stale document.
Signature = tuple[int, int, int, int, int]


def _signature(st: os.stat_result) -> Signature:
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns)


def _is_data_file(name: str) -> bool:
    return name in (DOCUMENT_NAME, HISTORY_NAME, FENCE_NAME) or name.startswith(CORRUPT_PREFIX)


def _has_data(directory: Path) -> bool:
    try:
        return any(_is_data_file(entry.name) for entry in directory.iterdir())
    except (FileNotFoundError, NotADirectoryError):
        return False


def _fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


class FileMemoryStorage:
    """:class:`storage.base.MemoryStorage` on disk."""

    def __init__(
        self, settings: MemqSettings, *, claim_check: Callable[[Fence], bool] | None = None
    ) -> None:
        """``claim_check`` tells whether a fence's claim is still the current one in the queue;
        a fenced save calls it under the document lock (workers pass one; hand edits need none)."""
        self.root = Path(settings.storage_dir)
        self._claim_check = claim_check
        self.lock_timeout_seconds = settings.storage_lock_timeout_seconds
        self.history_max_entries = settings.history_max_entries
        # Least recently used documents first; bounded, or a long-lived process would keep every
        # user it ever served.
        self._cache: OrderedDict[Path, tuple[Signature, bytes, MemoryDocument]] = OrderedDict()
        self._cache_max = settings.storage_cache_max_documents
        self._cache_lock = threading.Lock()

    # --- paths
    def directory(self, user_id: str | None, agent_name: str | None) -> Path:
        user, agent = validate_user_id(user_id), validate_agent_name(agent_name)
        # Encoded (reversibly, never a separator or a dot): any printable id is one folder name.
        base = self.root / "users" / encode_user(user)
        return base if agent is None else base / "agents" / encode_agent(agent)

    def path(self, user_id: str | None, agent_name: str | None = None) -> Path:
        """Where the memory.json of that (user, agent) lives (whether or not it exists yet)."""
        return self.directory(user_id, agent_name) / DOCUMENT_NAME

    # --- the protocol
    def load(self, user_id: str | None, agent_name: str | None = None) -> MemoryDocument:
        return self._load(user_id, agent_name, copy=True)

    def view(self, user_id: str | None, agent_name: str | None = None) -> MemoryDocument:
        """:meth:`load` without the private copy: never change what it returns
        (:class:`storage.base.SharedReads`)."""
        return self._load(user_id, agent_name, copy=False)

    def _load(self, user_id: str | None, agent_name: str | None, *, copy: bool) -> MemoryDocument:
        path = self.path(user_id, agent_name)
        try:
            sig = _signature(os.stat(path))
        except FileNotFoundError:
            self._forget_cached(path)
            return empty_document()
        except OSError as exc:
            raise StorageError(f"cannot stat {path}: {exc}") from exc
        with self._cache_lock:
            hit = self._cache.get(path)
            if hit is not None:
                self._cache.move_to_end(path)
        if hit is not None and hit[0] == sig:
            return copy_document(hit[2]) if copy else hit[2]
        document = self._read(path, locked=False)
        if document is None:
            return empty_document()
        return copy_document(document) if copy else document

    def save(
        self,
        user_id: str | None,
        agent_name: str | None,
        document: MemoryDocument,
        *,
        changes: list[Change] | None = None,
    ) -> None:
        directory = self.directory(user_id, agent_name)
        with self._locked(directory):
            self._write(directory / DOCUMENT_NAME, stamp_for_save(document))
            self._append_history(directory, changes or [])

    def fence_run(self, user_id: str | None, agent_name: str | None, fence: Fence) -> None:
        directory = self.directory(user_id, agent_name)
        with self._locked(directory):
            fences = read_fences(directory)
            check_fence(fences, fence)
            fences[fence.context_id] = fence.epoch
            write_fences(directory, fences)

    def update(
        self,
        user_id: str | None,
        agent_name: str | None,
        fn: UpdateFn,
        *,
        fence: Fence | None = None,
    ) -> MemoryDocument:
        directory = self.directory(user_id, agent_name)
        path = directory / DOCUMENT_NAME
        with self._locked(directory):
            fences = read_fences(directory) if fence is not None else {}
            # Read from disk, not the cache: inside the lock the file is the only truth.
            # The callback may mutate its argument: hand it a copy, never the cached object.
            read = self._read(path, locked=True) or empty_document()
            # `read` is the cache's entry, which nothing changes in place: it stays what was read
            # whatever the callback does to its copy, so it is what "nothing changed" compares to.
            document, changes = split_update_result(fn(copy_document(read)))
            if document == read and not changes:
                return document  # the callback's own object: nothing else holds it
            if fence is not None:
                # Checked under the lock, right before the write: a claim taken over after this
                # point waits for the lock in its own fence_run, and then reads this write.
                check_fence(fences, fence)
                if self._claim_check is not None and not self._claim_check(fence):
                    raise StaleClaim(
                        f"claim {fence.token} of {fence.context_id} is no longer current; not saved"
                    )
                fences[fence.context_id] = fence.epoch
                write_fences(directory, fences)
            saved = stamp_for_save(document)  # the cache's own copy
            self._write(path, saved)
            self._append_history(directory, changes)
        # The callback handed `document` over and nothing else holds it: the caller gets it back,
        # stamped like the saved copy, instead of a second copy.
        document.last_updated = saved.last_updated
        return document

    def history(
        self, user_id: str | None, agent_name: str | None = None, *, limit: int = 100
    ) -> list[Change]:
        path = self.directory(user_id, agent_name) / HISTORY_NAME
        try:
            lines = path.read_bytes().splitlines()
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc}") from exc
        return newest_first(decode_changes(lines), limit)

    def rewrite(self, user_id: str | None, agent_name: str | None, fn: RewriteFn) -> bool:
        directory = self.directory(user_id, agent_name)
        with self._locked(directory):
            current = self._read(directory / DOCUMENT_NAME, locked=True)
            if current is None:
                return False
            history_path = directory / HISTORY_NAME
            result = fn(copy_document(current), read_history_file(history_path))
            if result is None:
                return False
            self._write(directory / DOCUMENT_NAME, stamp_for_save(result[0]))
            try:
                write_history_file(history_path, bounded(result[1], self.history_max_entries))
            except OSError as exc:
                raise StorageError(f"cannot rewrite {history_path}: {exc}") from exc
        return True

    def list_users(self) -> list[str]:
        users_dir = self.root / "users"
        if not users_dir.is_dir():
            return []
        users = []
        for entry in sorted(users_dir.iterdir()):
            try:
                user = validate_user_id(decode_user(entry.name))
            except ValueError:
                continue  # not ours (a stray file or folder someone put there)
            if self.list_agents(user):
                users.append(user)
        return users

    def list_agents(self, user_id: str | None) -> list[str | None]:
        """Agents with stored data: a document, a history or a moved-aside corrupt copy (so that
        forgetting a user reaches every file of theirs)."""
        base = self.directory(user_id, None)
        found: list[str | None] = []
        if _has_data(base):
            found.append(None)
        agents_dir = base / "agents"
        if agents_dir.is_dir():
            for entry in sorted(agents_dir.iterdir()):
                try:
                    agent = decode_segment(entry.name)
                except ValueError:
                    continue  # not ours
                if agent == agent.lower() and _has_data(entry):
                    found.append(agent)
        return found

    def delete(self, user_id: str | None, agent_name: str | None) -> bool:
        """Remove the document, its history and any moved-aside corrupt copies, then the lock file
        and the folders left empty (forget means nothing of theirs stays on disk)."""
        directory = self.directory(user_id, agent_name)
        if not directory.is_dir():
            return False
        existed = False
        with self._locked(directory):
            for entry in directory.iterdir():
                if _is_data_file(entry.name):
                    entry.unlink(missing_ok=True)
                    existed = True
            self._forget_cached(directory / DOCUMENT_NAME)
            # Unlinked while held: a waiter that opened the old lock file notices the inode change
            # in `acquire_flock` and retries on a fresh one, so mutual exclusion holds across a
            # delete.
            (directory / LOCK_NAME).unlink(missing_ok=True)
        folders = [directory]
        if validate_agent_name(agent_name) is not None:
            folders += [directory.parent, directory.parent.parent]  # agents/, then the user
        for folder in folders:
            with contextlib.suppress(OSError):
                folder.rmdir()  # only succeeds when empty
        return existed

    # --- internals
    @contextlib.contextmanager
    def _locked(self, directory: Path) -> Iterator[None]:
        fd = acquire_flock(directory / LOCK_NAME, self.lock_timeout_seconds)
        try:
            yield
        finally:
            os.close(fd)  # closing the descriptor releases the flock

    def _read(self, path: Path, *, locked: bool) -> MemoryDocument | None:
        """Read, parse and cache the file; None when it does not exist."""
        try:
            with open(path, "rb") as f:
                sig = _signature(os.fstat(f.fileno()))
                data = f.read()
        except FileNotFoundError:
            self._forget_cached(path)
            return None
        except OSError as exc:
            raise StorageError(f"cannot read {path}: {exc}") from exc
        with self._cache_lock:
            hit = self._cache.get(path)
        if hit is not None and hit[1] == data:
            # The very bytes parsed before (compared, not trusted from a coarse mtime): parsing a
            # large document again is most of an update's own CPU, and equal bytes cannot parse
            # to anything else. The entry keeps the bytes: a fraction of the parsed document's
            # size in memory.
            self._remember(path, sig, data, hit[2])
            return hit[2]
        try:
            document = parse_document(data)
        except DocumentDecodeError as exc:
            self._forget_cached(path)
            raise self._quarantine(path, sig, str(exc), locked=locked) from exc
        self._remember(path, sig, data, document)
        return document

    def _quarantine(
        self, path: Path, sig: Signature, reason: str, *, locked: bool
    ) -> CorruptMemoryFile:
        """Move a corrupt file aside (if it is still the one we read) and describe it."""
        aside = path.with_name(f"{CORRUPT_PREFIX}{utc_now().strftime('%Y%m%dT%H%M%S%fZ')}")
        try:
            with contextlib.nullcontext() if locked else self._locked(path.parent):
                try:
                    unchanged = _signature(os.stat(path)) == sig
                except FileNotFoundError:
                    unchanged = False
                if not unchanged:  # someone already moved it aside or wrote a good one
                    return CorruptMemoryFile(f"{path} was corrupt when read ({reason}); retry")
                os.rename(path, aside)
                _fsync_dir(path.parent)
        except (OSError, LockTimeout) as exc:
            log.error("could not move the corrupt memory file %s aside: %s", path, exc)
            return CorruptMemoryFile(f"{path} is not a valid memory document: {reason}")
        log.error("corrupt memory file %s moved aside to %s: %s", path, aside.name, reason)
        return CorruptMemoryFile(
            f"{path} is not a valid memory document ({reason}); moved aside to {aside.name}"
        )

    def _write(self, path: Path, document: MemoryDocument) -> None:
        """Write ``document`` atomically; it becomes the cache's entry, so it must be the
        storage's own (every caller passes the private copy :func:`stamp_for_save` made)."""
        payload = dump_document(document).encode("utf-8")
        tmp = path.with_name(f".{path.name}.{uuid.uuid4().hex}.tmp")
        try:
            write_private(tmp, payload, sync=True)
            os.replace(tmp, path)
            _fsync_dir(path.parent)
            sig = _signature(os.stat(path))
        except OSError as exc:
            with contextlib.suppress(OSError):
                tmp.unlink()
            self._forget_cached(path)
            raise StorageError(f"cannot write {path}: {exc}") from exc
        self._remember(path, sig, payload, document)

    def _append_history(self, directory: Path, changes: list[Change]) -> None:
        """Append under the caller's lock; trim to the bound by an atomic rewrite."""
        append_history_file(directory / HISTORY_NAME, changes, self.history_max_entries)

    def _remember(self, path: Path, sig: Signature, data: bytes, document: MemoryDocument) -> None:
        if self._cache_max == 0:
            return
        with self._cache_lock:
            self._cache[path] = (sig, data, document)
            self._cache.move_to_end(path)
            while len(self._cache) > self._cache_max:
                self._cache.popitem(last=False)

    def _forget_cached(self, path: Path) -> None:
        with self._cache_lock:
            self._cache.pop(path, None)
