"""P10: resident memory of a process that loads the memory documents of 50,000 users through the
file storage, with the bounded document cache (``storage_cache_max_documents``, default 1000)
and with an unbounded one (the limit set above the number of users), measured in the same run.

The documents (20 facts each) are written straight to disk first (no fsync, no storage code: this
is setup, not the subject). Each variant then runs in a fresh interpreter, so one's freed memory
cannot hide the other's growth, and prints its RSS after 5k, 25k and 50k users.
"""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

from bench.common import BenchEnv, Result
from bench.p7_injection import memory_with_facts
from storage.history import dump_document

USERS = 50_000
CHECKPOINTS = (5_000, 25_000, 50_000)
FACTS = 20


def user_id(n: int) -> str:
    return f"user-{n:06d}"


def write_documents(root: Path, users: int) -> None:
    """``users`` memory.json files in the storage layout, written plainly and fast."""
    payload = dump_document(memory_with_facts(FACTS)).encode("utf-8")
    for n in range(users):
        directory = root / "users" / user_id(n)
        directory.mkdir(parents=True, exist_ok=True)
        (directory / "memory.json").write_bytes(payload)


def rss_mb() -> float:
    """Current resident set size in MiB (Linux /proc; elsewhere the peak, which only grows)."""
    try:
        with open("/proc/self/statm", encoding="ascii") as statm:
            pages = int(statm.read().split()[1])
        return pages * os.sysconf("SC_PAGE_SIZE") / 2**20
    except (OSError, ValueError):
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
        return peak / 2**20 if sys.platform == "darwin" else peak / 1024


def measure(root: Path, cache_max: int, users: int, checkpoints: tuple[int, ...]) -> list[float]:
    """In this process: load every user's document once, RSS at each checkpoint (MiB)."""
    from memq.core.settings import MemqSettings
    from storage.files import FileMemoryStorage

    settings = MemqSettings(storage_dir=root, storage_cache_max_documents=cache_max)
    storage = FileMemoryStorage(settings)
    figures = [rss_mb()]
    for n in range(users):
        if len(storage.load(user_id(n), None).facts) != FACTS:
            raise RuntimeError(f"{user_id(n)}: the document did not load whole")
        if n + 1 in checkpoints:
            figures.append(rss_mb())
    return figures


def measure_in_child(
    root: Path, cache_max: int, users: int, checkpoints: tuple[int, ...]
) -> list[float]:
    command = [
        sys.executable,
        "-m",
        "bench.p10_cache_rss",
        str(root),
        str(cache_max),
        str(users),
        ",".join(map(str, checkpoints)),
    ]
    out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
    figures: list[float] = json.loads(out.strip().splitlines()[-1])
    return figures


def run(env: BenchEnv) -> Result:
    users = 10_000 if env.quick else USERS
    checkpoints = (1_000, 5_000, 10_000) if env.quick else CHECKPOINTS
    root = env.work_dir / "p10-storage"
    write_documents(root, users)
    default = env.settings().storage_cache_max_documents
    bounded = measure_in_child(root, default, users, checkpoints)
    unbounded = measure_in_child(root, users * 10, users, checkpoints)

    def row(figures: list[float]) -> str:
        start = figures[0]
        return ", ".join(
            f"{c // 1000}k +{mb - start:.0f} MB"
            for c, mb in zip(checkpoints, figures[1:], strict=True)
        )

    growth_bounded = bounded[-1] - bounded[1]
    growth_unbounded = unbounded[-1] - unbounded[1]
    return Result(
        key="P10",
        title=f"RSS loading {users:,} users' documents (file storage)",
        measured=f"LRU of {default}: {row(bounded)}",
        baseline=f"unbounded cache, same run: {row(unbounded)}",
        goal=f"flat: RSS grows < 25 MB from {checkpoints[0]:,} to {users:,} users",
        met=growth_bounded < 25,
        details=[
            f"documents of {FACTS} facts ({len(dump_document(memory_with_facts(FACTS))):,} bytes "
            f"on disk), each loaded once; RSS above the interpreter's after imports",
            f"from {checkpoints[0]:,} to {users:,} users: LRU +{growth_bounded:.0f} MB, "
            f"unbounded +{growth_unbounded:.0f} MB",
            "each variant in a fresh interpreter, so freed memory of one cannot flatter the other",
        ],
        note="" if users == USERS else "quick run: 10k users",
    )


if __name__ == "__main__":
    # The child side of measure_in_child: ROOT CACHE_MAX USERS CHECKPOINTS → a JSON list of MiB.
    root_arg, cache_arg, users_arg, points_arg = sys.argv[1:5]
    points = tuple(int(p) for p in points_arg.split(","))
    print(json.dumps(measure(Path(root_arg), int(cache_arg), int(users_arg), points)))
