"""``python -m tests.support.find_tests MODULE [MODULE ...]``: the test files that exercise a
module, read from their imports (directly, or through a tests/support/ module they import).

    python -m tests.support.find_tests storage.redis_store worker.budget

A module's own name is the first place to look (``storage/files.py`` → tests/test_storage_file.py);
this finds the others, and never goes stale, since it reads the imports as they are.
"""

from __future__ import annotations

import ast
import sys
from pathlib import Path

TESTS = Path(__file__).resolve().parent.parent
ROOT = TESTS.parent


def imported_modules(path: Path) -> set[str]:
    """Every module ``path`` imports (``from a.b import c`` counts ``a.b`` and ``a.b.c``)."""
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def _covers(imported: set[str], module: str) -> bool:
    return any(name == module or name.startswith(module + ".") for name in imported)


def tests_of(module: str) -> list[str]:
    """``tests/test_x.py`` lines for ``module`` (a package counts its submodules), each saying
    through which support module when the test does not import it itself."""
    support = {
        f"tests.support.{path.stem}": imported_modules(path)
        for path in (TESTS / "support").glob("*.py")
    }
    found = []
    for path in sorted(TESTS.glob("test_*.py")):
        imported = imported_modules(path)
        if _covers(imported, module):
            found.append(str(path.relative_to(ROOT)))
            continue
        via = sorted(
            name for name, uses in support.items() if name in imported and _covers(uses, module)
        )
        if via:
            found.append(f"{path.relative_to(ROOT)} (via {', '.join(via)})")
    return found


def main(argv: list[str]) -> int:
    if not argv:
        print(__doc__.strip().splitlines()[0], file=sys.stderr)
        return 2
    for module in argv:
        print(f"{module}:")
        for line in tests_of(module) or ["(no test imports it)"]:
            print(f"  {line}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
