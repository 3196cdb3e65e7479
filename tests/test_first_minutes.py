"""The first ten minutes, as the README tells them: `make demo` (the `memq demo` it runs), then the
README's "After the demo" commands exactly as written, in a shell, from the same folder: `memq`
comes from activating `.venv`, `memq up` restarts the demo's stack, and `memq show` reads the
demo's memory with no URL or password exported. Real processes throughout."""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from memq.testing.celery_procs import REPO_ROOT
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.slow]

README = REPO_ROOT / "README.md"


def _block(marker: str) -> list[str]:
    """The commands of the shell block right after ``<!-- marker -->`` in the README."""
    found = re.search(
        rf"<!-- {re.escape(marker)} -->\n```sh\n(.*?)```", README.read_text("utf-8"), re.DOTALL
    )
    assert found, marker
    return [line for line in found.group(1).splitlines() if line.strip()]


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def _env() -> dict[str, str]:
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith("MEMQ_") and k not in ("OPENAI_API_KEY", "OPENAI_BASE_URL")
    }
    env["PYTHONPATH"] = str(REPO_ROOT)  # this tree's code, wherever the venv points
    env.pop("VIRTUAL_ENV", None)
    # Bare PATH: `memq` must come from activating .venv, as the README says.
    env["PATH"] = "/usr/local/bin:/usr/bin:/bin"
    # Fixed ports of `memq up` moved aside: other tests may hold them on this machine.
    env.update(
        MEMQ_EXPORTER_PORT="0",
        MEMQ_FLOWER_PORT=str(_free_port()),
        MEMQ_SERVE_PORT=str(_free_port()),
    )
    return env


def test_after_make_demo_the_readmes_next_commands_work_as_written(tmp_path: Path) -> None:
    (tmp_path / ".venv").symlink_to(Path(sys.prefix))
    env = _env()
    demo = subprocess.run(
        ["bash", "-c", "source .venv/bin/activate && memq demo --timeout 90"],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    assert demo.returncode == 0, demo.stdout + demo.stderr
    assert "MEMQ_DATA_DIR=.memq/demo memq up" in demo.stdout

    script = " && ".join(_block("after-demo:terminal-1"))
    log = (tmp_path / "up.log").open("wb")
    up = subprocess.Popen(
        ["bash", "-c", f"exec 2>&1; {script}"],
        cwd=tmp_path,
        env=env,
        stdout=log,
        stdin=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        wait_for(
            lambda: (
                " ready." in (tmp_path / "up.log").read_text(errors="replace")
                or up.poll() is not None
            ),
            interval=0.2,
            what="memq up ready",
        )
        assert up.poll() is None, (tmp_path / "up.log").read_text(errors="replace")
        second = subprocess.run(
            ["bash", "-c", " && ".join(_block("after-demo:terminal-2"))],
            cwd=tmp_path,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert second.returncode == 0, second.stdout + second.stderr
        # What the demo learned about alice, read back from the restarted Redis.
        assert "User is a data scientist at a climate research lab in Oslo" in second.stdout
        assert "<user_memory>" in second.stdout
        assert "Authentication required" not in second.stdout + second.stderr
    finally:
        os.killpg(up.pid, signal.SIGTERM)
        try:
            up.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(up.pid, signal.SIGKILL)
            up.wait(timeout=30)
        log.close()
