"""Upload listings and recalled memory never reach the memory model, however they are written,
and stripping them is one linear pass (hostile input: unclosed openers, nesting, mixed case)."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

from memq.core.identity import ContextKey
from memq.core.models import ConversationContext, Message, messages_from_json
from memq.core.settings import MemqSettings
from memq.memory.blocks import UPLOAD_BLOCK, strip_blocks
from producer.enqueue import build_request
from producer.injector import CLOSE_TAG, OPEN_TAG
from producer.messages import filter_messages_for_memory
from prompts.answer import find_update_object
from prompts.injection import format_memory_for_injection
from storage.document import Fact, MemoryDocument
from tests.support.memory_storage import InMemoryStorage
from worker.offline import RulesUpdateModel, extract_facts
from worker.pipeline import ExtractionPipeline

KEY = ContextKey.create("t1", "alice", None)


def pairs(messages: list[Message]) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in messages]


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("a <uploaded_files>x</uploaded_files>\n\nb", "a b"),
        ("a <CURRENT_UPLOADS>x</current_uploads>b", "a b"),
        ("a <memory>m <memory>n</memory> o</memory>b", "a b"),  # nested openers of one name
        ("a <user_memory>x <memory> y</user_memory>b", "a b"),  # another name inside is content
        ("keep <uploaded_files>unclosed rest", "keep "),  # cut short: the rest is the block's
        ("plain </memory> text", "plain </memory> text"),  # a lone closer is plain text
        ("no tags at all", "no tags at all"),
    ],
)
def test_strip_blocks(text: str, expected: str) -> None:
    assert strip_blocks(text).replace("  ", " ") == expected


def test_a_tail_whose_opener_was_cut_loses_what_precedes_its_closer() -> None:
    assert strip_blocks("e.pdf\n</uploaded_files>\nmy question", head_cut=True) == "my question"


def test_unclosed_kept_when_asked() -> None:
    assert strip_blocks("<think>x <think>y", UPLOAD_BLOCK, unclosed="keep") == "<think>x <think>y"


def test_reasoning_blocks_are_skipped_and_unclosed_ones_do_not_hide_the_answer() -> None:
    answer = '<think>{"user": 1}</think>{"user": {}, "history": {}, "newFacts": []}'
    assert find_update_object(answer) == {"user": {}, "history": {}, "newFacts": []}
    hostile = "<think>" * 20_000 + '{"user": {}, "history": {}, "newFacts": []}'
    assert find_update_object(hostile) == {"user": {}, "history": {}, "newFacts": []}


def test_current_uploads_turn_is_dropped_with_its_answer() -> None:
    raw = [
        {
            "role": "user",
            "content": "<current_uploads>\n- /mnt/user-data/uploads/a.pdf\n</current_uploads>\n",
        },
        {"role": "assistant", "content": "I see you uploaded a.pdf."},
        {"role": "user", "content": "<current_uploads>- b.csv</current_uploads>\nI live in Lyon"},
        {"role": "assistant", "content": "Noted."},
    ]
    assert pairs(filter_messages_for_memory(raw)) == [
        ("user", "I live in Lyon"),
        ("assistant", "Noted."),
    ]


def _memory_block() -> str:
    document = MemoryDocument(
        facts=[
            Fact(
                id="f1",
                content="I prefer dark mode in my editor.",
                category="preference",
                confidence=0.9,
                source="manual",
            )
        ]
    )
    text = format_memory_for_injection(document, 500, count_tokens=len)
    assert "dark mode" in text
    return f"{OPEN_TAG}\n{text}\n{CLOSE_TAG}"


def test_echoed_memory_blocks_are_never_sent_to_memory() -> None:
    block = _memory_block()
    deerflow = "<memory>\nUser works at Google.\n</memory>"
    raw = [
        {"role": "system", "content": f"You are helpful.\n\n{block}"},
        {"role": "user", "content": f"You told me:\n{block}\nI work for Google."},
        {"role": "assistant", "content": f"Here is what I remember:\n{deerflow}\nAnything else?"},
        {"role": "user", "content": deerflow},  # an agent that puts memory in a user turn
        {"role": "assistant", "content": "Thanks, noted."},  # ... and its answer to it
        {"role": "user", "content": "Show me my memory"},
        {"role": "assistant", "content": block},  # nothing but the echo
    ]
    assert pairs(filter_messages_for_memory(raw)) == [
        ("user", "You told me:\nI work for Google."),
        ("assistant", "Here is what I remember:\nAnything else?"),
        ("user", "Show me my memory"),
    ]


def _extract(context: ConversationContext) -> list[str]:
    storage = InMemoryStorage()
    ExtractionPipeline(
        MemqSettings(llm_provider="rules"),
        storage,
        RulesUpdateModel(count_tokens=len),
        count_tokens=len,
        clock=lambda: datetime(2026, 7, 15, tzinfo=UTC),
    ).run(context)
    return [f.content for f in storage.load(KEY.user_id, None).facts]


def test_nothing_is_learnt_from_a_quoted_memory_block_through_the_pipeline() -> None:
    block = _memory_block()
    raw = [
        {"role": "user", "content": f"Earlier you had:\n{block}\nI work for Google."},
        {"role": "assistant", "content": "Got it."},
    ]
    request = build_request(KEY, raw)
    assert request is not None
    context = ConversationContext(KEY, messages_from_json(request.messages_json))
    assert _extract(context) == ["User works at Google"]


def test_the_worker_strips_a_quoted_block_a_caller_sent_past_the_producer() -> None:
    block = _memory_block()
    context = ConversationContext(
        KEY,
        (
            Message("user", f"{block}\nI work for Google. {block[:-5]}"),  # one closed, one cut
            Message("assistant", "Got it."),
        ),
    )
    assert _extract(context) == ["User works at Google"]


@pytest.mark.timeout(30)
@pytest.mark.parametrize("opener", ["<uploaded_files>", "<current_uploads>", "<user_memory>"])
def test_a_huge_message_of_unclosed_openers_is_handled_at_once(opener: str) -> None:
    hostile = opener * (400_000 // len(opener))
    raw = [
        {"role": "user", "content": "I work for Google. " + hostile},
        {"role": "assistant", "content": "ok"},
    ]
    request = build_request(KEY, raw, max_chars=200_000)
    # Cut to the cap, the turn is openers only: at most a fragment of one is left.
    sent = () if request is None else messages_from_json(request.messages_json)
    assert all(len(m.content) < len(opener) for m in sent if m.role == "user")


@pytest.mark.timeout(30)
@pytest.mark.parametrize("filler", ["use x ", "我在", "应该用a"])
def test_the_rules_extractor_reads_a_huge_sentence_at_once(filler: str) -> None:
    # Lazy groups before a literal ("use X instead of Y") were quadratic in a sentence's length.
    hostile = filler * (400_000 // len(filler))
    assert [f.content for f in extract_facts(hostile + "\nI work for Google.")] == [
        "User works at Google"
    ]
