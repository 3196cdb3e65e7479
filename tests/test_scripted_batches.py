"""The scripted server's files and batches endpoints behave as OpenAI documents them, seen
through the real `openai` client: a test of the test double, so the batch lane's tests prove what
a real endpoint would do."""

from __future__ import annotations

import json

import openai
import pytest

from memq.core.errors import ConfigError
from memq.core.settings import load_settings
from tests.support.openai_server import Reply, ScriptedOpenAI


def client_for(server: ScriptedOpenAI) -> openai.OpenAI:
    return openai.OpenAI(api_key="sk-scripted", base_url=server.base_url, max_retries=0)


def line(custom: str, content: str = "hi") -> str:
    body = {"model": "m", "messages": [{"role": "user", "content": content}]}
    return json.dumps(
        {"custom_id": custom, "method": "POST", "url": "/v1/chat/completions", "body": body}
    )


def upload(client: openai.OpenAI, *lines: str, purpose: str = "batch") -> str:
    data = ("\n".join(lines) + "\n").encode()
    return client.files.create(file=("in.jsonl", data), purpose=purpose).id


def test_a_job_goes_validating_in_progress_completed_with_output_and_error_files(
    openai_server: ScriptedOpenAI,
) -> None:
    client = client_for(openai_server)
    file_id = upload(client, line("a", "alice@example.com <x>"), line("b"))
    job = client.batches.create(
        input_file_id=file_id, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert job.status == "validating"
    assert client.batches.retrieve(job.id).status == "in_progress"
    assert client.batches.retrieve(job.id).request_counts.total == 2
    openai_server.script(Reply(content="first"), Reply(status=429))
    assert openai_server.batches.complete() == 1
    done = client.batches.retrieve(job.id)
    assert done.status == "completed"
    assert (done.request_counts.completed, done.request_counts.failed) == (1, 1)
    assert done.output_file_id and done.error_file_id
    (out,) = [json.loads(x) for x in client.files.content(done.output_file_id).text.splitlines()]
    assert out["custom_id"] == "a" and out["response"]["status_code"] == 200
    assert out["response"]["body"]["choices"][0]["message"]["content"] == "first"
    (err,) = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
    assert err["custom_id"] == "b" and err["response"]["status_code"] == 429
    assert openai_server.call_count == 0  # batch requests are not synchronous calls
    assert openai_server.batches.answered[0]["messages"][0]["content"] == "alice@example.com <x>"


def test_an_expired_job_answers_what_it_reached_and_errors_the_rest(
    openai_server: ScriptedOpenAI,
) -> None:
    client = client_for(openai_server)
    job = client.batches.create(
        input_file_id=upload(client, line("a"), line("b"), line("c")),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    openai_server.batches.expire(answered=1)
    done = client.batches.retrieve(job.id)
    assert done.status == "expired" and done.output_file_id and done.error_file_id
    errors = [json.loads(x) for x in client.files.content(done.error_file_id).text.splitlines()]
    assert [e["custom_id"] for e in errors] == ["b", "c"]
    assert {e["error"]["code"] for e in errors} == {"batch_expired"}


def test_what_openai_refuses_is_refused(openai_server: ScriptedOpenAI) -> None:
    client = client_for(openai_server)
    good = upload(client, line("a"))
    with pytest.raises(openai.BadRequestError):
        client.batches.create(
            input_file_id=good,
            endpoint="/v1/chat/completions",
            completion_window="48h",
        )
    with pytest.raises(openai.BadRequestError):
        client.batches.create(
            input_file_id=upload(client, line("a"), purpose="assistants"),
            endpoint="/v1/chat/completions",
            completion_window="24h",
        )
    duplicate = client.batches.create(
        input_file_id=upload(client, line("a"), line("a")),
        endpoint="/v1/chat/completions",
        completion_window="24h",
    )
    failed = client.batches.retrieve(duplicate.id)
    assert failed.status == "failed" and failed.errors and failed.errors.data
    cancelled = client.batches.create(
        input_file_id=good, endpoint="/v1/chat/completions", completion_window="24h"
    )
    assert client.batches.cancel(cancelled.id).status == "cancelling"
    assert client.batches.retrieve(cancelled.id).status == "cancelled"
    with pytest.raises(openai.NotFoundError):
        client.batches.retrieve("batch_nope")


def test_a_bad_completion_window_is_one_line_naming_the_setting() -> None:
    with pytest.raises(ConfigError) as raised:
        load_settings(llm_batch_completion_window="1d")
    assert "MEMQ_LLM_BATCH_COMPLETION_WINDOW" in str(raised.value)
    assert "\n" not in str(raised.value)
    assert load_settings(llm_batch_completion_window="24h").llm_batch_window_ms == 86_400_000
