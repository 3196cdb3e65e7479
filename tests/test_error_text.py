"""An LLM endpoint's error text can echo the conversation: it is never stored as a dead
letter's reason, returned as the task result or logged at INFO; only its type and status are.
The real `openai` client against the scripted OpenAI-compatible server, a real redis-server."""

from __future__ import annotations

import json
import logging
from typing import Any

import pytest

from memq.core.clock import now_ms
from memq.core.settings import MemqSettings
from producer.producer import MemoryProducer
from tests.support.openai_server import Reply, ScriptedOpenAI
from tests.support.scenarios import stack_settings
from worker.queue import QueueClient
from worker.runtime import WorkerRuntime
from worker.tasks import extract

pytestmark = pytest.mark.integration

SECRET = "my passport number is XK-449-2210"
MESSAGES = [
    {"role": "user", "content": f"Remember this: {SECRET}."},
    {"role": "assistant", "content": "Noted."},
]


def echoing_error(status: int) -> Reply:
    """What an endpoint that quotes the request in its error looks like."""
    return Reply(
        status=status,
        body={
            "error": {
                "message": f"Invalid request: messages[0].content={SECRET!r} is not allowed",
                "type": "invalid_request_error",
                "param": "messages",
            }
        },
    )


def run_once(settings: MemqSettings) -> tuple[QueueClient, str, dict[str, Any]]:
    runtime = WorkerRuntime(settings)
    with MemoryProducer(settings) as producer:
        assert producer.flush("thread-echo", "alice@example.com", None, MESSAGES)
    [claim] = runtime.queue.claim(now_ms() + 60_000).claims
    result = extract(runtime, claim.context_id, claim.token)
    return runtime.queue, claim.context_id, result


@pytest.mark.parametrize(("status", "queue_state"), [(400, "dead"), (500, "retry")])
def test_the_endpoints_error_text_is_kept_out_of_reasons_results_and_info_logs(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    caplog: pytest.LogCaptureFixture,
    status: int,
    queue_state: str,
) -> None:
    openai_server.responder = lambda request: echoing_error(status)
    settings = stack_settings(make_settings, openai_server, max_attempts=3)
    with caplog.at_level(logging.DEBUG):
        queue, context_id, result = run_once(settings)
    assert result["queue"] == queue_state
    assert SECRET not in json.dumps(result)
    if queue_state == "dead":
        [entry] = queue.dead_list()
        reason = entry.last_error
    else:
        reason = str(queue.load(context_id)["last_error"])
    assert reason.startswith(("PermanentLLMError", "TransientLLMError"))
    assert str(status) in reason
    assert "passport" not in reason and "Invalid request" not in reason
    info = [r.getMessage() for r in caplog.records if r.levelno >= logging.INFO]
    assert info and not any("passport" in line for line in info)
    # For whoever debugs the endpoint, its text is there at DEBUG.
    debug = [r.getMessage() for r in caplog.records if r.levelno == logging.DEBUG]
    assert any("passport" in line for line in debug)
