"""The README's TypeScript agent (examples/typescript/agent.mjs: plain fetch, no SDK) run with
`node` against a real `memq serve`, worker and beat: its first turn is remembered, and its next
turn gets the memory block. Without node the test skips, except under CI, where it fails."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from typing import Any

import httpx
import pytest

from memq.core.settings import MemqSettings
from memq.testing.celery_procs import REPO_ROOT
from memq.testing.waiting import DEADLINE_SECONDS, wait_for
from tests.support.celery_procs import CeleryProcs, memq_env
from tests.support.openai_server import ScriptedOpenAI
from tests.support.scenarios import fact_for, learn_items, stack_settings
from tests.support.serve import Keys, bearer

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

AGENT = REPO_ROOT / "examples" / "typescript" / "agent.mjs"


def _node() -> str:
    node = shutil.which("node")
    if node is None:
        if os.environ.get("CI"):
            pytest.fail("node is not installed, and CI must run the TypeScript example")
        pytest.skip("node is not installed: the TypeScript example cannot run here")
    return node


def _run_agent(node: str, url: str, key: str, user: str, text: str, **env: str) -> dict[str, Any]:
    done = subprocess.run(
        [node, str(AGENT), user, text],
        env={"PATH": os.environ.get("PATH", ""), "MEMQ_URL": url, "MEMQ_API_KEY": key, **env},
        capture_output=True,
        text=True,
        timeout=DEADLINE_SECONDS,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])  # type: ignore[no-any-return]


def test_the_typescript_agent_hands_a_turn_over_and_reads_the_memory_back(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    serve_for: Any,
) -> None:
    node = _node()
    openai_server.responder = learn_items
    settings: MemqSettings = stack_settings(make_settings, openai_server)
    env = memq_env(settings)
    celery_procs.start_worker(env, concurrency=2)
    celery_procs.start_beat(env)
    server = serve_for(settings)
    key = Keys().app1_agent

    first = _run_agent(
        node, server.url, key, "app1-hana", "Remember that I own item-11.", FLUSH="1"
    )
    assert first["handOff"] == "queued"
    assert first["block"] == ""  # nothing known yet

    def remembered() -> bool:
        answer = httpx.get(
            server.url + "/v1/users/app1-hana/memory", headers=bearer(key), timeout=10
        )
        return fact_for("item-11") in [f["content"] for f in answer.json()["facts"]]

    wait_for(remembered, what="the first turn extracted")
    second = _run_agent(node, server.url, key, "app1-hana", "What do I own?")
    assert fact_for("item-11") in second["block"]
    assert second["reply"].startswith("I remember")

    # Outside its prefix the key is refused, and the example fails open: the turn still runs.
    other = _run_agent(node, server.url, key, "app2-ivan", "Hi")
    assert other == {"block": "", "reply": "You said: Hi", "handOff": "failed"}


def test_the_typescript_agent_keeps_working_when_memq_is_down() -> None:
    node = _node()
    from memq.local.redis_server import free_port

    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    out = _run_agent(node, url, "memq_whatever", "u1", "Hello")
    assert out == {"block": "", "reply": "You said: Hello", "handOff": "failed"}
