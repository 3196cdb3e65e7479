"""Reliability (issue 6): secrets stay secret, Flower stays locked.

An extraction runs with a recognisable LLM API key and a password-protected Redis; neither shows up
in the task messages on the broker (args, argsrepr, kwargsrepr), the worker's log, `memq stats
--json` or `memq config`. memq's own launchers never start Flower without basic auth.
"""

from __future__ import annotations

import base64
import json
from typing import Any

import pytest
import redis

from memq.cli import main
from memq.core.metrics import read_snapshot
from memq.core.settings import MemqSettings
from memq.local.options import StackOptions
from memq.local.redis_server import RedisServer
from memq.local.stack import Stack
from producer import MemoryProducer
from tests.support.celery_procs import CeleryProcs, memq_env
from tests.support.openai_server import ScriptedOpenAI
from tests.support.scenarios import fact_for, facts_of, learn_items, stack_settings, turn
from tests.support.waiting import wait_for
from worker.celery_app import TICK_TASK, create_app

pytestmark = pytest.mark.reliability

API_KEY = "sk-RELIABILITY-9f8e7d6c5b4a"
REDIS_PASSWORD = "redis-pw-Q7x2Lm9Vt4"
SECRETS = (API_KEY, REDIS_PASSWORD)


def assert_no_secret(where: str, text: str) -> None:
    for secret in SECRETS:
        assert secret not in text, f"{where} shows a secret"


@pytest.mark.e2e
@pytest.mark.integration
def test_api_key_and_redis_password_never_appear_in_messages_logs_or_cli(
    aof_redis: RedisServer,
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str],
) -> None:
    admin = redis.Redis.from_url(aof_redis.url, decode_responses=True)
    admin.config_set("requirepass", REDIS_PASSWORD)
    admin.close()
    url = f"redis://:{REDIS_PASSWORD}@127.0.0.1:{aof_redis.port}/0"
    openai_server.responder = learn_items
    settings: MemqSettings = stack_settings(
        make_settings, openai_server, redis_url=url, llm_api_key=API_KEY
    )
    client = redis.Redis.from_url(url, decode_responses=True)
    app = create_app(settings)
    try:
        with MemoryProducer(settings) as producer:
            assert producer.flush("t-secret", "sam", None, turn("item-7"))
        app.tasks[TICK_TASK]()  # one tick in this process: the extract task lands on the broker
        raw = client.lrange(settings.key_prefix, 0, -1)
        (message,) = [json.loads(m) for m in raw]
        assert message["headers"]["task"] == "memq.extract"
        body = base64.b64decode(message["body"]).decode()
        shown = json.dumps(message) + body
        assert_no_secret("the task message", shown)
        assert "item-7" not in shown  # no conversation content either
        assert "user=sam" in message["headers"]["argsrepr"]
        assert message["headers"]["kwargsrepr"] == "{}"

        env = memq_env(settings)
        worker = celery_procs.start_worker(env, concurrency=2)
        wait_for(lambda: facts_of(settings, "sam") == [fact_for("item-7")])
        assert openai_server.auth_headers[-1] == f"Bearer {API_KEY}"  # the key was really used
        assert_no_secret("the worker log", worker.log_text())

        # The task counts its outcome just after the save the facts showed.
        wait_for(
            lambda: read_snapshot(client, settings, 0).metrics.extractions == {"updated": 1},
        )
        for name, value in env.items():
            monkeypatch.setenv(name, value)
        capsys.readouterr()
        assert main(["stats", "--json"]) == 0
        stats_out = capsys.readouterr()
        assert json.loads(stats_out.out)["extractions"] == {"updated": 1}
        assert_no_secret("memq stats --json", stats_out.out + stats_out.err)
        assert main(["config"]) == 0
        config_out = capsys.readouterr()
        assert_no_secret("memq config", config_out.out + config_out.err)
        assert "MEMQ_LLM_API_KEY" in config_out.out and "MEMQ_REDIS_URL" in config_out.out
    finally:
        app.close()
        client.close()


@pytest.mark.parametrize("password", [None, "chosen-Flower-pw"])
def test_memqs_launcher_never_starts_flower_without_basic_auth(
    make_settings: Any, password: str | None
) -> None:
    settings: MemqSettings = make_settings(flower_password=password)
    stack = Stack(settings, StackOptions(worker=False, beat=False, flower=True))
    env = stack._child_env()
    (flower,) = stack._plan()
    user, _, secret = env["FLOWER_BASIC_AUTH"].partition(":")
    assert user == settings.flower_user and len(secret) >= 12
    assert secret == (password or stack.flower_password)
    assert "--address=127.0.0.1" in flower.argv  # loopback: /metrics is open even with auth
    assert not any(secret in arg for arg in flower.argv)  # argv is visible to every local user
