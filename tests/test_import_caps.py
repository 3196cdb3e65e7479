"""Every cap applies to an import too, through the real doors (`memq import` in a process of its
own, `PUT /v1/users/{user}/memory` on a real uvicorn): above MEMQ_MAX_FACTS, or with no readable
fact (unless replace empties the memory on purpose), the import is refused in one line and the
stored memory is left as it was."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx
import pytest

from memq.core.settings import MemqSettings
from memq.testing.celery_procs import REPO_ROOT, memq_env
from storage import get_storage
from storage.management import MemoryManager
from tests.support.serve import Keys, bearer

pytestmark = [pytest.mark.integration]

USER = "app1-erin/x"


def _seed(settings: MemqSettings) -> MemoryManager:
    manager = MemoryManager(get_storage(settings), max_facts=settings.max_facts)
    manager.add_fact(USER, "Lives in Oslo")
    return manager


def _facts(settings: MemqSettings) -> list[str]:
    return [f.content for f in get_storage(settings).load(USER).facts]


def _cli(settings: MemqSettings, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    env.update(memq_env(settings), PYTHONPATH=str(REPO_ROOT))
    return subprocess.run(
        [sys.executable, "-m", "memq.cli", *args],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def _many(count: int) -> dict[str, Any]:
    return {"facts": [{"content": f"Owns item {n}", "category": "context"} for n in range(count)]}


def test_the_cli_refuses_an_import_over_the_cap_or_without_a_readable_fact(
    make_settings: Any, tmp_path: Path
) -> None:
    settings = make_settings(max_facts=20)
    _seed(settings)
    big = tmp_path / "big.json"
    big.write_text(json.dumps(_many(300)), encoding="utf-8")
    refused = _cli(settings, "import", USER, str(big))
    assert refused.returncode == 1
    assert "300 facts, over the cap of 20 per memory (MEMQ_MAX_FACTS)" in refused.stderr
    assert len(refused.stderr.strip().splitlines()) == 1
    empty = tmp_path / "empty.json"
    empty.write_text(json.dumps({"facts": [1, 2]}), encoding="utf-8")
    refused = _cli(settings, "import", USER, str(empty))
    assert refused.returncode == 1
    assert "no readable fact" in refused.stderr and "--replace" in refused.stderr
    assert _facts(settings) == ["Lives in Oslo"]  # nothing half-written
    assert _cli(settings, "import", USER, str(empty), "--replace").returncode == 0
    assert _facts(settings) == []


def test_http_import_refuses_over_the_cap_and_an_empty_document_unless_replace(
    make_settings: Any, serve_for: Any
) -> None:
    settings = make_settings(max_facts=20)
    _seed(settings)
    server = serve_for(settings)
    path = "/v1/users/app1-erin%2Fx/memory"
    with httpx.Client(base_url=server.url, headers=bearer(Keys().admin), timeout=30) as http:
        over = http.put(path, json=_many(300))
        assert over.status_code == 422, over.text
        assert "over the cap of 20" in over.json()["detail"]
        empty = http.put(path, json={"facts": [1, 2]})
        assert empty.status_code == 422
        assert "no readable fact" in empty.json()["detail"]
        assert _facts(settings) == ["Lives in Oslo"]
        fits = http.put(path, json=_many(20))
        assert fits.status_code == 200 and fits.json() == {"facts": 20}
        emptied = http.put(path, params={"replace": "true"}, json={"facts": []})
        assert emptied.status_code == 200 and emptied.json() == {"facts": 0}
    assert _facts(settings) == []
