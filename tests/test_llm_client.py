"""The OpenAI-compatible client through the real `openai` SDK against the scripted server:
request shape, usage, retries of transient failures, typed errors, and the model choice."""

from __future__ import annotations

import logging
import re
from collections.abc import Iterator
from typing import Any

import pytest

from memq.core.errors import PermanentLLMError, TransientLLMError
from memq.core.models import Message
from memq.core.settings import MemqSettings
from memq.memory.update import UpdateAnswer
from memq.testing.provider import Provider, ResponseFormats
from prompts.answer import answer_json_schema
from prompts.update_prompt import UpdatePrompt
from tests.support.openai_server import EMPTY_UPDATE, Reply, ScriptedOpenAI, completion_body
from worker.llm import OpenAIUpdateModel, build_update_model
from worker.offline import RulesUpdateModel

SECRET = "sk-test-very-secret-key"
PROMPT = UpdatePrompt(system="instructions", user="data", conversation=(Message("user", "hi"),))


def llm_settings(server: ScriptedOpenAI, **overrides: Any) -> MemqSettings:
    values: dict[str, Any] = {
        "llm_provider": "openai",
        "llm_base_url": server.base_url,
        "llm_api_key": SECRET,
        "llm_model": "scripted-model",
        "llm_timeout_seconds": 5.0,
        "llm_max_retries": 2,
    }
    values.update(overrides)
    return MemqSettings(**values)


@pytest.fixture
def sleeps() -> list[float]:
    return []


def make_model(server: ScriptedOpenAI, sleeps: list[float], **overrides: Any) -> OpenAIUpdateModel:
    return OpenAIUpdateModel(llm_settings(server, **overrides), sleep=sleeps.append)


def test_request_shape_and_usage(openai_server: ScriptedOpenAI, sleeps: list[float]) -> None:
    openai_server.script(Reply(content=EMPTY_UPDATE, prompt_tokens=321, completion_tokens=45))
    answer = make_model(openai_server, sleeps).propose(PROMPT)
    assert answer.text == EMPTY_UPDATE
    assert (answer.prompt_tokens, answer.completion_tokens) == (321, 45)
    assert answer.model == "scripted-model" and answer.attempts == 1
    (request,) = openai_server.requests
    assert request["model"] == "scripted-model" and request["temperature"] == 0
    assert [m["role"] for m in request["messages"]] == ["system", "user"]
    assert openai_server.auth_headers == [f"Bearer {SECRET}"]


def test_the_request_body_is_the_chat_request_as_built(
    openai_server: ScriptedOpenAI, sleeps: list[float]
) -> None:
    """The messages and the schema skip the SDK's parameter transform: what the endpoint gets is
    still exactly the body `chat_request` builds (the batch lane's request lines send it too)."""
    from worker.llm import chat_request
    from worker.response_format import response_format

    openai_server.script(Reply(content=EMPTY_UPDATE))
    prompt = UpdatePrompt(
        system="instructions ü",
        user='data \u2028 "quoted"',
        conversation=(Message("user", "hi"), Message("assistant", "ok")),
    )
    make_model(openai_server, sleeps, llm_service_tier="flex").propose(prompt, cache_key="k1")
    (request,) = openai_server.requests
    built = chat_request(
        prompt,
        model="scripted-model",
        temperature=0,
        response_format=response_format("json_schema"),
    )
    assert request == {**built, "prompt_cache_key": "k1", "service_tier": "flex"}


def test_the_answer_models_schema_is_sent_as_structured_outputs(
    openai_server: ScriptedOpenAI, sleeps: list[float]
) -> None:
    """OpenAI's documented form, strict, with the schema the answer model generates."""
    make_model(openai_server, sleeps).propose(PROMPT)
    sent = openai_server.requests[0]["response_format"]
    assert sent["type"] == "json_schema"
    assert sent["json_schema"]["strict"] is True
    assert re.fullmatch(r"[A-Za-z0-9_-]{1,64}", sent["json_schema"]["name"])
    assert sent["json_schema"]["schema"] == answer_json_schema()
    generated = UpdateAnswer.model_json_schema(by_alias=True, mode="serialization")
    assert sent["json_schema"]["schema"]["$defs"].keys() == generated["$defs"].keys()


@pytest.mark.parametrize(
    ("setting", "expected"),
    [
        ("json_object", {"type": "json_object"}),
        ("json_schema", "json_schema"),
        ("none", None),
    ],
)
def test_the_setting_chooses_the_response_format(
    openai_server: ScriptedOpenAI, sleeps: list[float], setting: str, expected: Any
) -> None:
    make_model(openai_server, sleeps, llm_response_format=setting).propose(PROMPT)
    sent = openai_server.requests[0].get("response_format")
    assert (sent["type"] if expected == "json_schema" else sent) == expected


@pytest.fixture(params=[400, 500], ids=["openai-400", "llama-cpp-python-500"])
def refusing_server(request: pytest.FixtureRequest) -> Iterator[ScriptedOpenAI]:
    """An endpoint that refuses `json_schema`, as a model without structured outputs does (400)
    or as llama-cpp-python's server does (500)."""
    formats = ResponseFormats(refuse=("json_schema",), status=request.param)
    server = ScriptedOpenAI(provider=Provider(formats=formats)).start()
    yield server
    server.stop()


def test_an_endpoint_that_refuses_the_schema_costs_one_refusal_per_process(
    refusing_server: ScriptedOpenAI, sleeps: list[float]
) -> None:
    model = make_model(refusing_server, sleeps)
    answers = [model.propose(PROMPT) for _ in range(5)]
    assert [a.attempts for a in answers] == [1] * 5  # the refusal is no attempt, and unbilled
    assert len(refusing_server.refusals) == 1 and refusing_server.call_count == 6
    assert sleeps == []
    kinds = [r["response_format"] for r in refusing_server.requests]
    assert kinds[0]["type"] == "json_schema"
    # llama-cpp-python's own form: JSON mode with the schema, which its server then follows
    assert kinds[1:] == [{"type": "json_object", "schema": answer_json_schema()}] * 5


def test_each_refused_form_steps_down_once(
    openai_server: ScriptedOpenAI, sleeps: list[float]
) -> None:
    openai_server.provider.formats = ResponseFormats(refuse=("json_schema", "json_object"))
    model = make_model(openai_server, sleeps)
    model.propose(PROMPT)
    model.propose(PROMPT)
    # json_schema, json_object with its schema, json_object: then none, for good
    assert len(openai_server.refusals) == 3
    assert [r.get("response_format") for r in openai_server.requests[3:]] == [None, None]


def test_an_error_that_does_not_name_the_format_changes_nothing(
    openai_server: ScriptedOpenAI, sleeps: list[float]
) -> None:
    openai_server.script(Reply(status=400))
    model = make_model(openai_server, sleeps)
    with pytest.raises(PermanentLLMError, match="400"):
        model.propose(PROMPT)
    model.propose(PROMPT)
    assert openai_server.requests[1]["response_format"]["type"] == "json_schema"


def test_a_format_the_setting_insists_on_is_not_stepped_down(
    refusing_server: ScriptedOpenAI, sleeps: list[float]
) -> None:
    """The operator chose `json_schema`: one clear, permanent error, no retry to pay for."""
    model = make_model(refusing_server, sleeps, llm_response_format="json_schema")
    with pytest.raises(PermanentLLMError, match="refuses response_format json_schema"):
        model.propose(PROMPT)
    assert refusing_server.call_count == 1 and sleeps == []


def test_list_content_is_read_as_text(openai_server: ScriptedOpenAI, sleeps: list[float]) -> None:
    body = completion_body(Reply(), "m")
    body["choices"][0]["message"]["content"] = [{"type": "text", "text": EMPTY_UPDATE}]
    openai_server.script(Reply(body=body))
    assert make_model(openai_server, sleeps).propose(PROMPT).text == EMPTY_UPDATE


def test_server_errors_are_retried_with_backoff(
    openai_server: ScriptedOpenAI, sleeps: list[float]
) -> None:
    openai_server.script(Reply(status=500), Reply(status=503), Reply(content=EMPTY_UPDATE))
    answer = make_model(openai_server, sleeps).propose(PROMPT)
    assert answer.attempts == 3 and openai_server.call_count == 3
    assert sleeps == [0.5, 1.0]


def test_exhausted_retries_raise_a_transient_error(
    openai_server: ScriptedOpenAI, sleeps: list[float]
) -> None:
    openai_server.script(*[Reply(status=502)] * 5)
    with pytest.raises(TransientLLMError, match="gave up after 3 attempts"):
        make_model(openai_server, sleeps).propose(PROMPT)
    assert openai_server.call_count == 3


def test_rate_limit_honours_retry_after(openai_server: ScriptedOpenAI, sleeps: list[float]) -> None:
    openai_server.script(
        Reply(status=429, headers={"Retry-After": "2"}), Reply(content=EMPTY_UPDATE)
    )
    assert make_model(openai_server, sleeps).propose(PROMPT).attempts == 2
    assert sleeps == [2.0]


@pytest.mark.parametrize("value", ["soon", "inf", "Fri, 99 Foo 2026 25:61:00 GMT"])
def test_an_unreadable_retry_after_falls_back_to_the_backoff(
    openai_server: ScriptedOpenAI, sleeps: list[float], value: str
) -> None:
    openai_server.script(
        Reply(status=429, headers={"Retry-After": value}), Reply(content=EMPTY_UPDATE)
    )
    assert make_model(openai_server, sleeps).propose(PROMPT).attempts == 2
    assert len(sleeps) == 1 and 0 < sleeps[0] < 60


def test_a_long_retry_after_is_handed_to_the_queue_not_slept(
    openai_server: ScriptedOpenAI, sleeps: list[float]
) -> None:
    openai_server.script(Reply(status=429, headers={"Retry-After": "120"}))
    with pytest.raises(TransientLLMError) as caught:
        make_model(openai_server, sleeps).propose(PROMPT)
    assert caught.value.retry_after_seconds == 120.0
    assert sleeps == [] and openai_server.call_count == 1


def test_timeouts_are_retried_then_raised(
    openai_server: ScriptedOpenAI, sleeps: list[float]
) -> None:
    openai_server.script(*[Reply(content=EMPTY_UPDATE, delay_seconds=1.5)] * 3)
    with pytest.raises(TransientLLMError, match="timed out"):
        make_model(openai_server, sleeps, llm_timeout_seconds=0.3).propose(PROMPT)
    assert openai_server.call_count == 3


def test_a_timeout_then_success(openai_server: ScriptedOpenAI, sleeps: list[float]) -> None:
    openai_server.script(Reply(content="{}", delay_seconds=1.5), Reply(content=EMPTY_UPDATE))
    model = make_model(openai_server, sleeps, llm_timeout_seconds=0.3)
    assert model.propose(PROMPT).text == EMPTY_UPDATE


@pytest.mark.parametrize("status", [400, 401, 403, 404, 422])
def test_permanent_failures_are_not_retried(
    openai_server: ScriptedOpenAI, sleeps: list[float], status: int
) -> None:
    openai_server.script(Reply(status=status))
    with pytest.raises(PermanentLLMError, match=str(status)):
        make_model(openai_server, sleeps).propose(PROMPT)
    assert openai_server.call_count == 1


def test_the_api_key_is_never_logged(
    openai_server: ScriptedOpenAI, sleeps: list[float], caplog: pytest.LogCaptureFixture
) -> None:
    openai_server.script(Reply(status=500), Reply(status=401))
    with caplog.at_level(logging.DEBUG):
        model = build_update_model(llm_settings(openai_server))
        assert isinstance(model, OpenAIUpdateModel)
        with pytest.raises(PermanentLLMError) as caught:
            make_model(openai_server, sleeps).propose(PROMPT)
    assert "retrying" in caplog.text
    assert SECRET not in caplog.text and SECRET not in str(caught.value)


def test_unreachable_endpoint_is_transient(sleeps: list[float]) -> None:
    config = MemqSettings(
        llm_provider="openai", llm_base_url="http://127.0.0.1:9/v1", llm_max_retries=1
    )
    with pytest.raises(TransientLLMError, match="unreachable"):
        OpenAIUpdateModel(config, sleep=sleeps.append).propose(PROMPT)
    assert len(sleeps) == 1


def test_model_choice_follows_the_settings(openai_server: ScriptedOpenAI) -> None:
    assert isinstance(build_update_model(MemqSettings()), RulesUpdateModel)
    chosen = build_update_model(MemqSettings(llm_base_url=openai_server.base_url))
    assert isinstance(chosen, OpenAIUpdateModel)
    chosen.close()
