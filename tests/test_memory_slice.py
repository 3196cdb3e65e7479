"""The memory slice: past a token budget, the update prompt shows the protected categories and the
facts most relevant to the new messages, in document order; under it, the whole memory."""

from __future__ import annotations

from datetime import UTC, datetime

from memq.core.models import Message
from memq.core.settings import MemqSettings
from prompts.memory_slice import slice_facts
from prompts.tokens import make_token_counter
from prompts.update_prompt import build_update_prompt
from storage.document import Fact, MemoryDocument

NOW = datetime(2026, 7, 15, 12, 0, tzinfo=UTC)
COUNT = make_token_counter(False)


def big_memory() -> MemoryDocument:
    facts = [
        Fact(content=f"Fact {n}: likes hiking trail number {n} in the Alps", confidence=0.8)
        for n in range(200)
    ]
    facts.insert(50, Fact(content="Deploys with uvicorn behind nginx", confidence=0.7))
    facts.insert(
        120,
        Fact(content="Never suggest pip, the user uses uv", category="correction", confidence=0.95),
    )
    return MemoryDocument(facts=facts)


def test_under_the_budget_every_fact_is_shown() -> None:
    memory = big_memory()
    shown = slice_facts(memory.facts, "x", max_tokens=100_000, protected=(), count_tokens=COUNT)
    assert shown == memory.facts


def test_past_the_budget_relevant_and_protected_facts_in_document_order() -> None:
    memory = big_memory()
    shown = slice_facts(
        memory.facts,
        "How do I run uvicorn in production?",
        max_tokens=400,
        protected=("correction",),
        count_tokens=COUNT,
    )
    contents = [f.content for f in shown]
    assert "Deploys with uvicorn behind nginx" in contents
    assert "Never suggest pip, the user uses uv" in contents  # protected, whatever the query
    assert len(shown) < len(memory.facts)
    order = [memory.facts.index(f) for f in shown]
    assert order == sorted(order)  # old before new: the prefix stays cacheable


def test_the_prompt_carries_the_slice_when_set() -> None:
    memory = big_memory()
    message = [Message("user", "Which uvicorn workers should I use?")]
    full = build_update_prompt(
        memory, message, settings=MemqSettings(), now=NOW, count_tokens=COUNT
    )
    sliced = build_update_prompt(
        memory,
        message,
        settings=MemqSettings(memory_slice_max_tokens=400),
        now=NOW,
        count_tokens=COUNT,
    )
    assert full is not None and sliced is not None
    assert "hiking trail number 199" in full.user
    assert "uvicorn behind nginx" in sliced.user and "uses uv" in sliced.user
    assert COUNT(sliced.user) < COUNT(full.user) / 3


def test_a_configured_category_is_protected_however_it_is_spelt() -> None:
    """`Corrections` in the settings names the stored category `correction`, as staleness,
    consolidation and injection read it: the slice keeps those facts whatever the query."""
    memory = big_memory()
    message = [Message("user", "Which hiking trail is the longest?")]
    settings = MemqSettings(
        memory_slice_max_tokens=400, staleness_protected_categories=" Corrections"
    )
    sliced = build_update_prompt(memory, message, settings=settings, now=NOW, count_tokens=COUNT)
    assert sliced is not None
    assert "Never suggest pip, the user uses uv" in sliced.user
