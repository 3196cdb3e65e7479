"""`memq demo` from a clean folder: the embedded stack starts, learns from the sample conversations
and prints the memory, then stops everything."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.e2e, pytest.mark.slow]


def test_demo_prints_what_it_learned(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    env.pop("OPENAI_API_KEY", None)
    data_dir = tmp_path / "demo"
    done = subprocess.run(
        [
            str(Path(sys.executable).with_name("memq")),
            "demo",
            "--data-dir",
            str(data_dir),
            "--timeout",
            "60",
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=100,
    )
    out = done.stdout
    assert done.returncode == 0, done.stdout + done.stderr
    assert "extractor: offline rules extractor" in out
    # One section per sample user, each with the facts of its conversations.
    alice = out[out.index("about alice (agent researcher)") : out.index("about wang")]
    assert "User is a data scientist at a climate research lab in Oslo" in alice
    assert "User prefers concise answers with code examples" in alice
    assert "correction  0.95        Use Python instead of MATLAB" in alice  # the correction
    wang = out[out.index("about wang (agent (global))") : out.index("about bob")]
    assert "用户喜欢简洁的中文回答" in wang and "用户是后端工程师" in wang
    bob = out[out.index("about bob (agent analyst)") :]
    assert "User is a sales manager at a bicycle shop in Lyon" in bob
    assert "q3_sales" not in out and "uploads" not in out  # the upload was never remembered
    # The block an agent would get.
    assert out.count("<user_memory>") == 3 and out.count("</user_memory>") == 3
    assert "- [correction | 0.95] Use Python instead of MATLAB" in out
    assert out.rstrip().endswith("`memq --help` for the rest.")
    # Everything lived in the demo folder: the memory in the private Redis (the default
    # storage), which kept its AOF there.
    assert any((data_dir / "redis").glob("appendonly*"))
    assert not (data_dir / "memory").exists()
    assert not (tmp_path / ".memq").exists()
