"""The soak's scripted model learns exactly the markers of the new messages of a real update
prompt (not those of earlier messages or of the memory), and its faults are what they say."""

from __future__ import annotations

import json
from datetime import UTC, datetime

import pytest

from bench.soak.model import ModelProfile, SoakModel
from bench.soak.oracle import MARKER
from memq.core.errors import ResponseParseError
from memq.core.models import Message
from memq.core.settings import MemqSettings
from prompts.answer import parse_update_response
from prompts.tokens import make_token_counter
from prompts.update_prompt import build_update_prompt
from storage.document import Fact, MemoryDocument

OLD, EARLIER, NEW1, NEW2 = (f"M-{n:012x}" for n in (1, 2, 3, 4))


def request() -> dict[str, object]:
    memory = MemoryDocument(facts=[Fact(content=f"The user's code word is {OLD}", confidence=0.9)])
    prompt = build_update_prompt(
        memory,
        [
            Message("user", f"Please remember the code {NEW1}."),
            Message("assistant", "Noted."),
            Message("user", f"Please remember the code {NEW2}."),
        ],
        earlier=[Message("user", f"Please remember the code {EARLIER}.")],
        settings=MemqSettings(token_counting=False),
        now=datetime.now(UTC),
        count_tokens=make_token_counter(False),
    )
    assert prompt is not None
    assert EARLIER in prompt.user and OLD in prompt.user  # shown, but not new
    return {"model": "m", "messages": prompt.chat_messages()}


def test_a_healthy_answer_has_one_fact_per_new_marker_naming_the_call() -> None:
    model = SoakModel(ModelProfile(fault_rate=0.0, slow_rate=0.0))
    reply = model(request())
    assert reply.status == 200 and 0.05 <= reply.delay_seconds <= 2.0
    answer = parse_update_response(reply.content)
    markers = [MARKER.findall(fact.content) for fact in answer.new_facts]
    assert markers == [[NEW1], [NEW2]]
    assert all("model call 1" in fact.content for fact in answer.new_facts)
    assert all(fact.confidence >= 0.7 for fact in answer.new_facts)


@pytest.mark.parametrize("seed", range(3))
def test_faults_are_errors_or_answers_that_do_not_parse(seed: int) -> None:
    model = SoakModel(ModelProfile(fault_rate=1.0, slow_rate=0.0, timeout_seconds=9.0), seed=seed)
    for _ in range(30):
        reply = model(request())
        if reply.status == 429:
            assert reply.headers["Retry-After"] == "1"
        elif reply.status != 200:
            assert reply.status >= 500
        elif reply.delay_seconds == 9.0:
            assert json.loads(reply.content or "") == {}  # sent after the client gave up
        else:
            with pytest.raises(ResponseParseError):
                parse_update_response(reply.content)
    assert sum(model.outcomes.values()) == 30 and "ok" not in model.outcomes
