"""Supervision helpers of the local stack: the restart policy, the data-folder lock, and children
that die with their supervisor.

The policy is a pure function of crash times, so it is tested without processes.
"""

from __future__ import annotations

import contextlib
import ctypes
import fcntl
import os
import signal
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from memq.core.errors import MemqError


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """Restart a dead child after a back-off that doubles with each recent crash; give up (stop
    the stack, non-zero) when more than ``max_crashes`` happened within ``window_seconds``."""

    initial_backoff_seconds: float = 0.5
    max_backoff_seconds: float = 8.0
    window_seconds: float = 60.0
    max_crashes: int = 5


def restart_delay(crashes: Sequence[float], now: float, policy: RestartPolicy) -> float | None:
    """Seconds to wait before restarting a child whose crash times (monotonic, the latest one
    included) are ``crashes``; None when it crashed too often recently and the stack must stop."""
    recent = [at for at in crashes if now - at <= policy.window_seconds]
    if len(recent) > policy.max_crashes:
        return None
    steps = max(len(recent) - 1, 0)
    return float(min(policy.max_backoff_seconds, policy.initial_backoff_seconds * 2**steps))


class StackLocked(MemqError, RuntimeError):
    """Another `memq up` (or demo) already runs on this data folder."""


class DataDirLock:
    """An exclusive ``flock`` on ``<data_dir>/memq.lock`` for the life of a stack.

    Two stacks on one data folder would start two Redis servers on one AOF. The kernel drops the
    lock when the holder dies, however it dies, so a stale file never blocks the next start.
    """

    def __init__(self, data_dir: Path) -> None:
        self.path = Path(data_dir) / "memq.lock"
        self._fd: int | None = None

    def acquire(self) -> DataDirLock:
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip() or "unknown"
            os.close(fd)
            raise StackLocked(
                f"another memq up is already running on {self.path.parent.resolve()} "
                f"(pid {holder}); stop it, or give this one its own MEMQ_DATA_DIR"
            ) from None
        os.ftruncate(fd, 0)
        os.write(fd, str(os.getpid()).encode())
        self._fd = fd
        return self

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                fcntl.flock(self._fd, fcntl.LOCK_UN)
            os.close(self._fd)
            self._fd = None


_PR_SET_PDEATHSIG = 1


def die_with_parent() -> Callable[[], None] | None:
    """A ``preexec_fn`` asking Linux to SIGTERM the child when its supervisor dies (even by
    SIGKILL): an orphaned Redis would keep the port and the AOF from the next `memq up`.
    None elsewhere. The libc handle is looked up here, in the parent, so the child only makes
    one system call between fork and exec."""
    if not sys.platform.startswith("linux"):
        return None
    try:
        prctl = ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None
    term = int(signal.SIGTERM)

    def preexec() -> None:
        prctl(_PR_SET_PDEATHSIG, term, 0, 0, 0)

    return preexec
