"""No module of memq's packages grows past 400 lines: a long module is several nouns that want
their own files."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PACKAGES = ("memq", "storage", "prompts", "producer", "worker")
LIMIT = 400


def lines_of(path: Path) -> int:
    return len(path.read_text(encoding="utf-8").splitlines())


def test_no_module_is_over_the_limit_but_the_named_ones() -> None:
    over = {
        path.relative_to(ROOT).as_posix(): lines_of(path)
        for package in PACKAGES
        for path in (ROOT / package).rglob("*.py")
        if lines_of(path) > LIMIT
    }
    assert over == {}
