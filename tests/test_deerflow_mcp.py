"""The README's DeerFlow `extensions_config.json` for memq's MCP server works as DeerFlow would use
it: whole-value `$VAR` substitution, then langchain-mcp-adapters over stdio (`memq mcp`) and over
HTTP (`memq serve`), `remember` then `recall` through a real worker. The client runs in its own
interpreter (`make clients`: langchain-mcp-adapters needs the MCP SDK 1.x, memq serves with 2.x),
and the README's example sentences teach the offline extractor a fact."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from memq.core.settings import MemqSettings
from memq.local.redis_server import RedisServer
from memq.testing.celery_procs import REPO_ROOT
from tests.support.celery_procs import CeleryProcs, memq_env
from tests.support.serve import Keys
from worker.offline import extract_facts

README = (REPO_ROOT / "README.md").read_text(encoding="utf-8")
CLIENT = REPO_ROOT / "tests" / "support" / "clients" / "deerflow_mcp.py"
SAID = "I prefer window seats on long flights."
FACT = "User prefers window seats on long flights"


def _clients_python() -> Path:
    configured = os.environ.get("CLIENTS_PYTHON")
    path = Path(configured) if configured else REPO_ROOT / ".venv-clients" / "bin" / "python"
    if not path.exists():
        pytest.skip("the third-party clients' venv is missing: run `make clients`")
    return path


def _snippet() -> dict[str, Any]:
    found = re.search(r"<!-- deerflow-extensions-config -->\n```json\n(.*?)```", README, re.DOTALL)
    assert found
    return json.loads(found.group(1))  # type: ignore[no-any-return]


def test_the_readmes_example_sentences_teach_the_offline_extractor() -> None:
    curl = re.search(r'"content": "(I [^"]+)"', README)
    assert curl and extract_facts(curl.group(1)), curl
    assert SAID in README
    assert [f.content for f in extract_facts(SAID)] == [FACT]


def test_the_snippet_uses_only_whole_value_substitutions() -> None:
    def strings(value: Any) -> list[str]:
        if isinstance(value, dict):
            return [s for v in value.values() for s in strings(v)]
        if isinstance(value, list):
            return [s for v in value for s in strings(v)]
        return [value] if isinstance(value, str) else []

    for text in strings(_snippet()):
        assert "$" not in text[1:], f"DeerFlow substitutes only a whole value: {text!r}"


@pytest.mark.e2e
def test_deerflow_reaches_memq_over_stdio_and_http_with_langchain_mcp_adapters(
    tmp_path: Path, celery_procs: CeleryProcs, serve_for: Any
) -> None:
    python = _clients_python()
    with RedisServer(tmp_path / "redis", appendonly=False) as redis_server:
        # The default key prefix: the snippet passes only the URL and the data folder.
        settings = MemqSettings(
            redis_url=redis_server.url,
            data_dir=tmp_path / "data",
            llm_provider="rules",
            debounce_seconds=0.0,
            tick_seconds=0.2,
        )
        (tmp_path / "data").mkdir()
        env = memq_env(settings)
        celery_procs.start_worker(env, concurrency=2)
        celery_procs.start_beat(env)
        server = serve_for(settings)
        snippet = _snippet()
        snippet["mcpServers"]["memq-http"]["url"] = server.url + "/mcp"  # its free port
        config = tmp_path / "extensions_config.json"
        config.write_text(json.dumps(snippet), encoding="utf-8")
        # `memq` on the client's PATH runs this tree's code (the venv may point elsewhere).
        bin_dir = tmp_path / "bin"
        bin_dir.mkdir()
        (bin_dir / "memq").write_text(
            f'#!/bin/sh\nPYTHONPATH={REPO_ROOT} exec {sys.executable} -m memq.cli "$@"\n'
        )
        (bin_dir / "memq").chmod(0o755)
        client_env = {
            "PATH": f"{bin_dir}:/usr/bin:/bin",
            "HOME": str(tmp_path),
            "MEMQ_REDIS_URL": settings.redis_url,
            "MEMQ_DATA_DIR": str(settings.data_dir),
            "MEMQ_MCP_AUTHORIZATION": f"Bearer {Keys().agent}",
            "MEMQ_MCP_USER": "dora",
        }
        done = subprocess.run(
            [str(python), str(CLIENT), str(config), SAID, FACT, "60"],
            env=client_env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
    assert done.returncode == 0, done.stdout + done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert set(out) == {"memq", "memq-http"}
    for name, answers in out.items():
        assert answers["remember"] == "will be remembered", (name, answers)
        assert FACT in answers["recall"], (name, answers)
