"""memq installed (a real wheel, built from this tree) into a fresh virtual environment next to a
host application that has a top-level package named ``core`` — the name of many a Django app.
Both must work: the host's ``core`` stays the host's, and an agent-side round trip through the
installed memq (a producer hand-off into a real redis-server, an injector read) succeeds."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path
from typing import Any

import pytest
import redis

from memq.core.identity import ContextKey
from memq.core.keys import KeySchema
from memq.core.settings import MemqSettings
from storage import get_storage
from storage.document import Fact, MemoryDocument

ROOT = Path(__file__).resolve().parent.parent
SKIP = shutil.ignore_patterns(
    ".git", ".venv", "__pycache__", "*.egg-info", "build", "dist", ".*_cache", "node_modules"
)

HOST_CORE = {
    "core/__init__.py": 'NAME = "the host application\'s core"\n',
    "core/models.py": "class Order:\n    pass\n",
    "core/memory.py": "LOCAL = True\n",
}

AGENT = """
import json, sys
import core
from core.models import Order
from memq import MemoryInjector, MemoryProducer, MemqSettings
import memq, producer, storage

settings = MemqSettings()
with MemoryProducer(settings) as hand_off:
    sent = hand_off.flush(
        "t-1",
        "alice@example.com",
        None,
        [
            {"role": "user", "content": "I moved to Porto."},
            {"role": "assistant", "content": "Noted."},
        ],
    )
injector = MemoryInjector(settings)
block = injector.block("alice@example.com")
injector.close()
import core as again, core.memory
print(json.dumps({
    "sent": sent,
    "block": block,
    "host_core": again.NAME,
    "host_memory": core.memory.LOCAL,
    "order": Order.__module__,
    "memq_from": [memq.__file__, producer.__file__, storage.__file__],
    "core_from": core.__file__,
}))
"""


def run(*args: str, cwd: Path | None = None, **kwargs: Any) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        args, cwd=cwd, capture_output=True, text=True, timeout=300, check=False, **kwargs
    )
    assert done.returncode == 0, f"{args[:4]}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.fixture(scope="module")
def fresh_env(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A new virtual environment holding memq's wheel; its dependencies come from this test run's
    environment by a plain path (so nothing is downloaded), never this source tree."""
    base = tmp_path_factory.mktemp("install")
    source = base / "src"
    shutil.copytree(ROOT, source, ignore=SKIP)
    wheels = base / "wheels"
    run(
        sys.executable,
        "-m",
        "pip",
        "wheel",
        "--no-deps",
        "--no-build-isolation",
        "--no-index",
        "-q",
        "-w",
        str(wheels),
        str(source),
    )
    (wheel,) = wheels.glob("memq-*.whl")
    env = base / "venv"
    run(sys.executable, "-m", "venv", "--without-pip", str(env))
    python = env / "bin" / "python"
    purelib = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    site = Path(run(str(python), "-c", purelib).stdout.strip())
    run(
        sys.executable, "-m", "pip", "install", "--no-deps", "-q", "--target", str(site), str(wheel)
    )
    # The dependencies (redis, pydantic, ...) of this run, by path: a .pth line adds the folder
    # alone, so this run's editable install of memq (activated by its own .pth) stays out.
    (site / "zz_dependencies.pth").write_text(sysconfig.get_paths()["purelib"] + "\n", "utf-8")
    return python, site


def test_the_wheel_installs_no_top_level_core_or_memory(fresh_env: tuple[Path, Path]) -> None:
    _, site = fresh_env
    top_level = {p.name for p in site.iterdir() if (p / "__init__.py").exists()}
    assert {"memq", "producer", "storage", "prompts", "worker"} <= top_level
    assert not {"core", "memory"} & top_level
    assert (site / "memq" / "core" / "includes" / "release_claim.lua").is_file()
    # Every package of the source tree is in the wheel (a subpackage missing from pyproject's
    # list works in an editable install and is absent from a real one).
    root = Path(__file__).resolve().parent.parent
    packages = {
        init.parent.relative_to(root).as_posix()
        for top in ("memq", "producer", "storage", "prompts", "worker")
        for init in (root / top).rglob("__init__.py")
    }
    assert {p for p in packages if not (site / p / "__init__.py").is_file()} == set()


def test_an_agent_round_trip_beside_a_host_package_named_core(
    fresh_env: tuple[Path, Path],
    make_settings: Any,
    redis_client: redis.Redis,
    tmp_path: Path,
) -> None:
    python, site = fresh_env
    settings: MemqSettings = make_settings()
    get_storage(settings, redis=redis_client).save(
        "alice@example.com", None, MemoryDocument(facts=[Fact(content="Prefers green tea")])
    )
    app = tmp_path / "host_app"
    for name, text in HOST_CORE.items():
        (app / name).parent.mkdir(parents=True, exist_ok=True)
        (app / name).write_text(text, encoding="utf-8")
    (app / "agent.py").write_text(AGENT, encoding="utf-8")
    env = {
        "PATH": "/usr/bin:/bin",
        "MEMQ_REDIS_URL": settings.redis_url,
        "MEMQ_KEY_PREFIX": settings.key_prefix,
        "MEMQ_STORAGE_DIR": str(tmp_path / "memory"),
        "MEMQ_DATA_DIR": str(tmp_path / "data"),
    }
    done = run(str(python), "agent.py", cwd=app, env=env)
    result = json.loads(done.stdout.strip().splitlines()[-1])

    assert result["host_core"] == "the host application's core" and result["host_memory"] is True
    assert result["order"] == "core.models"
    assert result["core_from"] == str(app / "core" / "__init__.py")
    assert all(path.startswith(str(site)) for path in result["memq_from"]), result["memq_from"]
    assert result["sent"] is True
    assert "Prefers green tea" in result["block"]
    context_id = ContextKey.create("t-1", "alice@example.com", None).id
    due = KeySchema(settings.key_prefix).for_context(context_id).due
    assert redis_client.zscore(due, context_id) is not None  # the hand-off is in the queue
