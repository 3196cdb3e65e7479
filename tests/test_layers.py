"""The package layers hold: every import of our code points down, never up, and never across a
floor; and no module imports itself through others (no import circle).

The floors, lowest first (one row a floor; packages on one floor are siblings and must not import
each other):

    memq.core < storage < memq.memory < prompts < producer < worker < memq.operations
    < memq.local < {memq.evaluation, memq.server, memq.integrations}
    < {memq.testing, memq.commands} < memq (the package root: cli.py, __init__.py)

``memq.core`` and ``memq.memory`` live inside the ``memq`` folder (so memq installs beside an
application that has its own ``core`` package) but are floors of their own; every subfolder of
``memq/`` is ranked here, so a new one fails until it is given a floor. ``worker`` must not import
``producer`` although it is below it: the two run in different processes and share only what lies
beneath both. An agent imports ``memq`` or ``producer``: that must not load Celery or the OpenAI
SDK (seconds of import time, and dependencies an agent may not have). Imports are read from the
source (every ``import``, also the lazy ones inside functions and those under ``TYPE_CHECKING``),
so a layering slip fails here before anything runs.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
FLOORS: tuple[tuple[str, ...], ...] = (
    ("memq.core",),
    ("storage",),
    ("memq.memory",),
    ("prompts",),
    ("producer",),
    ("worker",),
    ("memq.operations",),
    ("memq.local",),
    ("memq.evaluation", "memq.server", "memq.integrations"),
    ("memq.testing", "memq.commands"),
    ("memq",),
)
LAYERS = tuple(name for floor in FLOORS for name in floor)
NESTED = tuple(name for name in LAYERS if name.startswith("memq."))  # floors inside memq/
RANK = {name: rank for rank, floor in enumerate(FLOORS) for name in floor}
FORBIDDEN = {("worker", "producer")}  # (importer, imported) even though the order allows it
HEAVY = ("celery", "openai")


def layer_of(module: str) -> str:
    """The layer a dotted module name belongs to (its top-level package, or a nested layer)."""
    for nested in NESTED:
        if module == nested or module.startswith(nested + "."):
            return nested
    return module.split(".")[0]


def imports_of(path: Path) -> list[tuple[int, str]]:
    """(line, layer) of every absolute import in ``path``."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            found += [(node.lineno, layer_of(alias.name)) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, layer_of(node.module)))
    return found


def files_of(layer: str) -> list[Path]:
    folder = ROOT.joinpath(*layer.split("."))
    inner = [
        ROOT.joinpath(*n.split(".")) for n in NESTED if n != layer and n.startswith(layer + ".")
    ]
    return [
        path
        for path in sorted(folder.rglob("*.py"))
        if not any(path.is_relative_to(skip) for skip in inner)
    ]


def violations() -> list[str]:
    wrong = []
    for layer in LAYERS:
        for path in files_of(layer):
            for line, target in imports_of(path):
                if target not in RANK or target == layer:
                    continue
                where = f"{path.relative_to(ROOT)}:{line}"
                if RANK[target] > RANK[layer]:
                    wrong.append(f"{where}: {layer} (lower) imports {target} (higher)")
                elif RANK[target] == RANK[layer]:
                    wrong.append(f"{where}: {layer} imports its sibling {target}")
                elif (layer, target) in FORBIDDEN:
                    wrong.append(f"{where}: {layer} must not import {target}")
    return wrong


def test_no_layer_imports_a_higher_one() -> None:
    assert violations() == []


def test_every_subfolder_of_memq_has_a_floor() -> None:
    folders = {
        f"memq.{path.name}"
        for path in (ROOT / "memq").iterdir()
        if path.is_dir() and (path / "__init__.py").exists()
    }
    assert folders - set(LAYERS) == set()


def module_of(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_graph() -> dict[str, set[str]]:
    """Module → the modules of ours it imports (``from a import b`` names ``a.b`` when that is a
    module of ours, else ``a``)."""
    paths = [p for top in {n.split(".")[0] for n in LAYERS} for p in (ROOT / top).rglob("*.py")]
    modules = {module_of(p) for p in paths}
    graph: dict[str, set[str]] = {}
    for path in paths:
        source = module_of(path)
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
            if isinstance(node, ast.Import):
                found |= {a.name for a in node.names if a.name in modules}
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                for alias in node.names:
                    name = f"{node.module}.{alias.name}"
                    if name in modules:
                        found.add(name)
                    elif node.module in modules:
                        found.add(node.module)
        graph[source] = found - {source}
    return graph


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import circles (strongly connected groups of two or more modules), by Tarjan."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            group = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                group.append(member)
                if member == node:
                    break
            if len(group) > 1:
                found.append(sorted(group))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_no_import_circle() -> None:
    """A circle is two modules that cannot be read (or moved) apart: one of them holds the part
    both need, which then belongs in a module of its own."""
    assert circles(import_graph()) == []


def test_the_circle_finder_sees_a_circle() -> None:
    assert circles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]


def test_the_checker_sees_a_violation(tmp_path: Path) -> None:
    """The walk above finds lazy and TYPE_CHECKING imports too (else it could pass vacuously)."""
    sample = tmp_path / "sample.py"
    sample.write_text(
        "from typing import TYPE_CHECKING\n"
        "if TYPE_CHECKING:\n    from worker.queue import Claim\n"
        "def f():\n    import producer.spool\n",
        encoding="utf-8",
    )
    assert [target for _, target in imports_of(sample)] == ["typing", "worker", "producer"]


@pytest.mark.parametrize(
    "statement",
    [
        "import memq",
        "import producer",
        "from memq import MemoryInjector, MemoryProducer, MemqSettings",
        "from producer import MemoryInjector, MemoryProducer",
    ],
)
def test_what_an_agent_imports_loads_neither_celery_nor_openai(statement: str) -> None:
    script = (
        f"import json, sys\n{statement}\n"
        f"print(json.dumps(sorted(m for m in {HEAVY!r} if m in sys.modules)))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []
