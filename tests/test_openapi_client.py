"""A client generated from docs/openapi.json by openapi-python-client (as a user of the API would
make one) works against a real `memq serve`: it is generated without a warning, every error
answer parses into the one shared `Problem` type (a 403 and a 404 here), and the memory document
is typed."""

from __future__ import annotations

import importlib
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from memq.core.settings import MemqSettings
from storage import get_storage
from storage.management import MemoryManager
from tests.support.serve import Keys

pytestmark = [pytest.mark.integration]

DOCUMENT = Path(__file__).resolve().parent.parent / "docs" / "openapi.json"
GENERATOR = Path(sys.executable).with_name("openapi-python-client")


@pytest.fixture
def generated(tmp_path: Path) -> Iterator[Any]:
    out = tmp_path / "memq_api_client"
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    done = subprocess.run(
        [
            *(str(GENERATOR), "generate", "--path", str(DOCUMENT)),
            *("--meta", "none", "--output-path", str(out)),
        ],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Warning" not in done.stdout + done.stderr, done.stdout + done.stderr
    sys.path.insert(0, str(tmp_path))
    try:
        yield importlib.import_module("memq_api_client")
    finally:
        sys.path.remove(str(tmp_path))
        for name in [m for m in sys.modules if m.startswith("memq_api_client")]:
            del sys.modules[name]


def test_a_generated_client_gets_typed_problems_and_a_typed_document(
    settings: MemqSettings, serve_for: Any, generated: Any
) -> None:
    MemoryManager(get_storage(settings)).add_fact("app1-ada", "Prefers tea")
    server = serve_for(settings)
    keys = Keys()
    client_mod = importlib.import_module("memq_api_client.client")
    delete_fact = importlib.import_module("memq_api_client.api.admin.delete_fact")
    memory = importlib.import_module("memq_api_client.api.agent.memory")
    models = importlib.import_module("memq_api_client.models")

    agent = client_mod.AuthenticatedClient(base_url=server.url, token=keys.app1_agent)
    refused = delete_fact.sync_detailed("app1-ada", "fact_00000000", client=agent)
    assert refused.status_code == 403
    assert isinstance(refused.parsed, models.Problem)
    assert refused.parsed.status == 403 and "admin" in refused.parsed.detail

    admin = client_mod.AuthenticatedClient(base_url=server.url, token=keys.admin)
    missing = delete_fact.sync_detailed("app1-ada", "fact_00000000", client=admin)
    assert missing.status_code == 404
    assert isinstance(missing.parsed, models.Problem) and missing.parsed.status == 404

    document = memory.sync("app1-ada", client=agent)
    assert isinstance(document, models.MemoryDocument)
    assert [fact.content for fact in document.facts] == ["Prefers tea"]
