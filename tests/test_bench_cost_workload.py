"""COST's scripted model answers from what the real update prompt shows it: a restated fact is
re-added (in other words) only when the fact it restates is not in ``<current_memory>``, and a
memory holding both is counted as one missed duplicate."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any

import pytest

from bench.cost_workload import (
    RESTATING_TURN,
    SEEDED_FACTS,
    answer,
    learnt_items,
    missed_duplicates,
    restated_fact,
    seeded_content,
    session,
)
from memq.core.models import Message
from memq.core.settings import MemqSettings
from prompts.tokens import make_token_counter
from prompts.update_prompt import build_update_prompt
from storage.document import Fact, MemoryDocument

NOW = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
COUNT = make_token_counter(False)
USER, NUMBER = 3, 1


def seeded(*, without: int | None = None) -> MemoryDocument:
    return MemoryDocument(
        facts=[
            Fact(content=seeded_content(USER, n), confidence=0.9)
            for n in range(SEEDED_FACTS)
            if n != without
        ]
    )


def request_for(memory: MemoryDocument, **settings: Any) -> dict[str, Any]:
    """The chat request the worker would send for one session, built by the real prompt."""
    messages = [Message(m["role"], m["content"]) for m in session(USER, NUMBER, 3)]
    prompt = build_update_prompt(
        memory, messages, settings=MemqSettings(**settings), now=NOW, count_tokens=COUNT
    )
    assert prompt is not None
    return {"messages": prompt.chat_messages()}


def new_facts(request: dict[str, Any]) -> list[str]:
    content = answer(request).content
    assert content is not None
    return [f["content"] for f in json.loads(content)["newFacts"]]


@pytest.mark.parametrize("layout", ["cache_friendly", "compact"])
def test_a_restated_fact_it_can_see_is_not_added_again(layout: str) -> None:
    facts = new_facts(request_for(seeded(), llm_prompt_layout=layout))
    assert facts == [f"The user owns item-{USER}-{NUMBER}-{t}" for t in range(3)]


def test_a_restated_fact_it_cannot_see_is_added_in_other_words() -> None:
    n = restated_fact(USER, NUMBER)
    facts = new_facts(request_for(seeded(without=n)))
    assert len(facts) == 4
    assert facts[-1].startswith(f"Uses {n % 7 + 2}-space indents in project p{n} ")
    assert facts[-1] != seeded_content(USER, n)  # exact-content deduplication cannot catch it
    memory = seeded()
    stored = memory.model_copy(
        update={"facts": [*memory.facts, *(Fact(content=f, confidence=0.9) for f in facts)]}
    )
    assert missed_duplicates(stored, USER) == 1
    assert missed_duplicates(memory, USER) == 0
    assert learnt_items(stored) == sorted(facts[:3])


def test_only_the_restating_turn_restates_and_each_session_a_different_fact() -> None:
    said = [m["content"] for m in session(USER, NUMBER, 3) if m["role"] == "user"]
    assert ["indents" in s for s in said] == [t == RESTATING_TURN for t in range(3)]
    assert len({restated_fact(USER, number) for number in range(4)}) == 4
