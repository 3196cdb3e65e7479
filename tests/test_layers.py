"""The package layers hold: every import of our code points down (or sideways), never up.

memq.core < storage < memq.memory < prompts < producer < worker < memq; bench/ and tests/ sit
outside. ``memq.core`` and ``memq.memory`` live inside the ``memq`` folder (so memq installs beside
an application that has its own ``core`` package) but are layers of their own, at the bottom.
``worker`` must not import ``producer`` although it is below it: the two run in different
processes and share only what lies beneath both. An agent imports ``memq`` or ``producer``: that
must not load Celery or the OpenAI SDK (seconds of import time, and dependencies an agent may not
have). Imports are read from the source (every ``import``, also the lazy ones inside functions
and those under ``TYPE_CHECKING``), so a layering slip fails here before anything runs.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
LAYERS = ("memq.core", "storage", "memq.memory", "prompts", "producer", "worker", "memq")
NESTED = ("memq.core", "memq.memory")  # layers that live inside the memq folder
RANK = {name: rank for rank, name in enumerate(LAYERS)}
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
                elif (layer, target) in FORBIDDEN:
                    wrong.append(f"{where}: {layer} must not import {target}")
    return wrong


def test_no_layer_imports_a_higher_one() -> None:
    assert violations() == []


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
