"""How the test suite is laid out, held by a test (tests/README.md says why):

- a test module never imports another test module: what two modules share lives in
  tests/support/ (or memq/testing/ when the benchmarks use it too), fixtures in tests/conftest.py
  or a support module listed in its ``pytest_plugins``;
- every test module is on the map of tests/README.md (area → test files), so a newcomer finds it;
- every wait in the tests, memq/testing/ and bench/soak/ uses the one deadline of
  :mod:`memq.testing.waiting` (no timeout written as a number at the call), and nothing sleeps to
  let things settle: a sleep is a condition's polling interval or a scripted delay, and says so
  (``wait-ok`` on its line).
"""

from __future__ import annotations

import ast
import re
from collections.abc import Callable
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
TESTS = ROOT / "tests"
WAIT_SCOPE = (TESTS, ROOT / "memq" / "testing", ROOT / "bench" / "soak")
WAITS = {"wait_for", "wait_for_log", "wait_text"}


def _is_test_module(name: str) -> bool:
    """``tests.test_x`` (or ``test_x`` / ``.test_x`` relative): a module pytest collects."""
    last = name.rsplit(".", 1)[-1]
    return last.startswith("test_") and name.split(".")[0] in ("tests", "", last)


def imported_test_modules(source: str) -> list[str]:
    """The test modules ``source`` imports, as written."""
    found: list[str] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            module = "." * node.level + (node.module or "")
            names = [module] + [f"{module}.{a.name}".lstrip(".") for a in node.names]
            found += [n for n in names if _is_test_module(n.lstrip("."))][:1]
        elif isinstance(node, ast.Import):
            found += [a.name for a in node.names if _is_test_module(a.name)]
    return found


def numeric_wait_timeouts(source: str) -> list[int]:
    """Lines where a wait is given a timeout written as a number instead of the shared deadline."""
    lines = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        is_asyncio = isinstance(func, ast.Attribute) and getattr(func.value, "id", "") == "asyncio"
        if name in WAITS and not is_asyncio:
            for keyword in node.keywords:
                if keyword.arg == "timeout" and isinstance(keyword.value, ast.Constant):
                    lines.append(node.lineno)
    return lines


def unmarked_sleeps(source: str) -> list[int]:
    """Lines that sleep without saying why (``wait-ok``: a polling interval, a scripted delay)."""
    text = source.splitlines()
    lines = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Call):
            func = node.func
            name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
            if name == "sleep" and "wait-ok" not in text[node.lineno - 1]:
                lines.append(node.lineno)
    return lines


def _python_files(*folders: Path) -> list[Path]:
    return sorted(path for folder in folders for path in folder.rglob("*.py"))


def test_no_test_module_imports_another_test_module() -> None:
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in _python_files(TESTS)
        for name in imported_test_modules(path.read_text(encoding="utf-8"))
    ]
    assert offenders == [], "move what they share to tests/support/: " + "; ".join(offenders)


def test_every_test_module_is_on_the_map() -> None:
    readme = (TESTS / "README.md").read_text(encoding="utf-8")
    mapped = set(re.findall(r"`(test_\w+\.py)`", readme))
    present = {path.name for path in TESTS.glob("test_*.py")}
    assert sorted(present - mapped) == [], "add them to the map in tests/README.md"
    assert sorted(mapped - present) == [], "tests/README.md maps files that do not exist"


def _wait_offenders(rule: Callable[[str], list[int]]) -> str:
    return ", ".join(
        f"{path.relative_to(ROOT)}:{line}"
        for path in _python_files(*WAIT_SCOPE)
        for line in rule(path.read_text(encoding="utf-8"))
    )


def test_every_wait_uses_the_shared_deadline() -> None:
    offenders = _wait_offenders(numeric_wait_timeouts)
    assert not offenders, f"use memq.testing.waiting.DEADLINE_SECONDS: {offenders}"


def test_nothing_sleeps_to_let_things_settle() -> None:
    offenders = _wait_offenders(unmarked_sleeps)
    assert not offenders, f"wait on a condition (memq.testing.waiting): {offenders}"


@pytest.mark.parametrize(
    ("source", "expected"),
    [
        ("from tests.test_cli import run\n", ["tests.test_cli"]),
        ("import tests.test_cli\n", ["tests.test_cli"]),
        ("from tests import test_cli\n", ["tests.test_cli"]),
        ("from .test_cli import run\n", [".test_cli"]),
        ("from test_cli import run\n", ["test_cli"]),
        ("from tests.support.cli import run\n", []),
        ("from memq.testing.waiting import wait_for\n", []),
        ("from tests.support import documents\n", []),
    ],
)
def test_the_import_rule_sees_every_spelling(source: str, expected: list[str]) -> None:
    assert imported_test_modules(source) == expected


def test_the_wait_rules_see_a_number_and_an_unmarked_sleep() -> None:
    source = (
        "wait_for(ready, timeout=30)\n"
        "wait_for(ready)\n"
        "worker.wait_for_log(' ready.', timeout=DEADLINE_SECONDS)\n"
        "time.sleep(1)\n"
        "time.sleep(0.1)  # wait-ok: polling\n"
    )
    assert numeric_wait_timeouts(source) == [1]
    assert unmarked_sleeps(source) == [4]
