"""The `integration` marker means "needs a real redis-server", for every test: deselecting it
leaves only tests that run without one."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def collected(*args: str) -> set[str]:
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider", *args],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode in (0, 5), done.stdout + done.stderr  # 5: nothing collected
    return {line for line in done.stdout.splitlines() if "::" in line}


def test_deselecting_integration_leaves_only_tests_without_a_redis_server() -> None:
    files = (
        "tests/test_storage_contract.py",
        "tests/test_failover.py",  # starts servers of its own
        "tests/test_demo.py",  # end to end: `memq demo` starts its own
        "tests/test_soak.py",  # the soak harness starts its own
        "tests/test_prompt.py",
    )
    kept = collected("-m", "not integration", *files)
    # The contract's backends all need Redis; the registry check does not. The prompt tests are
    # pure.
    assert {n.split("::")[0] for n in kept} == {
        "tests/test_storage_contract.py",
        "tests/test_prompt.py",
    }
    contract = {n for n in kept if n.startswith("tests/test_storage_contract.py")}
    assert contract == {
        "tests/test_storage_contract.py::"
        "test_the_registry_names_exactly_the_backends_the_setting_accepts"
    }
