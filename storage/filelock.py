"""The cross-process lock of one memory document: an exclusive fcntl ``flock`` with a timeout.

A contended lock is waited for with a *blocking* flock, not by polling: the kernel hands the lock
over as soon as it is released, so a waiter is not starved by holders that re-lock within the sleep
of a poller (seen with several processes of several threads each adding facts to one document).
flock has no timeout of its own, so a helper thread does the blocking wait and the caller waits on
it with one.
"""

from __future__ import annotations

import fcntl
import os
import threading
import time
from pathlib import Path

from memq.core.errors import LockTimeout, StorageError
from storage.private import make_private_dirs, open_private


def acquire_flock(lock_path: Path, timeout_seconds: float) -> int:
    """A descriptor holding the exclusive flock on ``lock_path`` (closing it releases the lock).

    Raises LockTimeout when the lock is not ours within ``timeout_seconds``. The lock file may be
    unlinked by its holder (a delete); a waiter that got the lock on the old inode retries on the
    current file, so mutual exclusion holds across a delete.
    """
    deadline = time.monotonic() + timeout_seconds
    while True:
        fd = _open(lock_path)
        if fd is not None:
            if not _try_flock(fd, lock_path) and not _wait_for_flock(
                fd, deadline - time.monotonic(), lock_path
            ):
                break  # timed out; the descriptor now belongs to the abandoned waiter
            if _still_current(lock_path, fd):
                return fd
            os.close(fd)
        if time.monotonic() >= deadline:
            break
    raise LockTimeout(f"could not lock {lock_path} within {timeout_seconds:g} s")


def _open(lock_path: Path) -> int | None:
    try:
        make_private_dirs(lock_path.parent)
        return open_private(lock_path, os.O_RDWR | os.O_CREAT)
    except FileNotFoundError:
        return None  # a concurrent delete pruned the folder between mkdir and open
    except OSError as exc:
        raise StorageError(f"cannot open the lock file {lock_path}: {exc}") from exc


def _try_flock(fd: int, lock_path: Path) -> bool:
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        return False
    except OSError as exc:
        os.close(fd)
        raise StorageError(f"cannot lock {lock_path}: {exc}") from exc
    return True


def _still_current(lock_path: Path, fd: int) -> bool:
    """Whether the locked descriptor is still the file at ``lock_path``."""
    try:
        return os.stat(lock_path).st_ino == os.fstat(fd).st_ino
    except FileNotFoundError:
        return False


def _wait_for_flock(fd: int, timeout_seconds: float, lock_path: Path) -> bool:
    """Block on the flock of ``fd`` for at most ``timeout_seconds``; True once it is held.

    On a timeout the wait is abandoned and the helper thread owns ``fd``: it closes it (releasing
    the lock, should it still arrive) when its flock returns. The caller must not touch ``fd``
    after False.
    """
    if timeout_seconds <= 0:
        os.close(fd)
        return False
    guard = threading.Lock()
    done = threading.Event()
    errors: list[OSError] = []
    abandoned = False

    def wait() -> None:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            errors.append(exc)
        with guard:  # decide who owns fd under the guard: the caller, or this thread
            if abandoned:
                os.close(fd)
            else:
                done.set()

    threading.Thread(target=wait, name="memq-flock-wait", daemon=True).start()
    done.wait(timeout_seconds)
    with guard:
        if not done.is_set():
            abandoned = True
            return False
    if errors:
        os.close(fd)
        raise StorageError(f"cannot lock {lock_path}: {errors[0]}") from errors[0]
    return True
