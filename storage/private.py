"""Folders and files only their owner can read: memory documents hold what users told their agents.

Folders are made 0700 and files 0600 whatever the process umask (``Path.mkdir(parents=True)``
would make every missing parent with the umask's default, typically 0755).
"""

from __future__ import annotations

import os
from pathlib import Path

FOLDER_MODE = 0o700
FILE_MODE = 0o600


def make_private_dirs(directory: Path) -> None:
    """Create ``directory`` and any missing parent, each 0700; existing folders are left as they
    are (the operator chose them)."""
    missing: list[Path] = []
    current = directory
    while not current.is_dir():
        missing.append(current)
        if current.parent == current:
            break
        current = current.parent
    for folder in reversed(missing):
        try:
            os.mkdir(folder, FOLDER_MODE)
        except FileExistsError:
            continue  # made concurrently by another process
        os.chmod(folder, FOLDER_MODE)  # mkdir's mode is reduced by the umask


def open_private(path: Path, flags: int) -> int:
    """``os.open`` that creates the file 0600 (and keeps it so under any umask)."""
    fd = os.open(path, flags | os.O_CLOEXEC, FILE_MODE)
    if flags & os.O_CREAT:
        os.fchmod(fd, FILE_MODE)
    return fd


def write_private(path: Path, data: bytes, *, exclusive: bool = True, sync: bool = False) -> None:
    """Write ``data`` to a new 0600 file (``exclusive``: refuse an existing one)."""
    flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_TRUNC)
    fd = open_private(path, flags)
    with os.fdopen(fd, "wb") as f:
        f.write(data)
        if sync:
            f.flush()
            os.fsync(f.fileno())


def append_private(path: Path, data: bytes) -> None:
    fd = open_private(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND)
    with os.fdopen(fd, "ab") as f:
        f.write(data)
