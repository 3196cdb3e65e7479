"""Message filtering (reference §1), minimum dialogue and the size bound, on dicts and on
LangChain-like objects."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import pytest

from memq.core.errors import InvalidMessages
from memq.core.models import Message
from producer.messages import (
    filter_messages_for_memory,
    has_minimum_dialogue,
    is_valid_human_input_response,
)

VALID_HIR: dict[str, Any] = {
    "version": 1,
    "kind": "human_input_response",
    "source": "clarify",
    "request_id": "r1",
    "value": "Tuesday",
    "response_kind": "text",
}
UPLOAD = "<uploaded_files>\n- /mnt/data/report.pdf\n</uploaded_files>\n\n"


@dataclass
class LCMessage:
    """Duck-types a LangChain message without importing LangChain."""

    type: str
    content: Any
    id: str | None = None
    tool_calls: list[Any] = field(default_factory=list)
    additional_kwargs: dict[str, Any] = field(default_factory=dict)


def pairs(messages: list[Message]) -> list[tuple[str, str]]:
    return [(m.role, m.content) for m in messages]


def test_keeps_user_and_final_assistant_text_in_order() -> None:
    raw = [
        {"role": "system", "content": "You are helpful."},
        {"role": "user", "content": "I live in Lyon", "id": "u1"},
        {"role": "assistant", "content": None, "tool_calls": [{"id": "c1"}]},
        {"role": "tool", "content": "weather: rain", "tool_call_id": "c1"},
        {"role": "assistant", "content": "It rains in Lyon.", "id": "a1"},
    ]
    out = filter_messages_for_memory(raw)
    assert pairs(out) == [("user", "I live in Lyon"), ("assistant", "It rains in Lyon.")]
    assert [m.id for m in out] == ["u1", "a1"]


def test_tool_calling_ai_message_is_dropped_even_with_text() -> None:
    raw = [
        {"role": "user", "content": "q"},
        {"role": "assistant", "content": "let me look", "tool_calls": [{"id": "c"}]},
    ]
    assert pairs(filter_messages_for_memory(raw)) == [("user", "q")]


def test_list_content_is_joined_text() -> None:
    raw = [
        {
            "role": "user",
            "content": [
                {"type": "text", "text": "look at"},
                {"type": "image_url", "image_url": {"url": "data:..."}},
                "this",
            ],
        },
        {"role": "assistant", "content": [{"type": "text", "text": "a cat"}]},
    ]
    assert pairs(filter_messages_for_memory(raw)) == [
        ("user", "look at this"),
        ("assistant", "a cat"),
    ]


@pytest.mark.parametrize("flag", ["hidden", "hide_from_ui"])
def test_hidden_message_is_dropped(flag: str) -> None:
    raw = [
        {"role": "user", "content": "<memory>facts</memory>", flag: True},
        {"role": "user", "content": "hi"},
        {"role": "assistant", "content": "hello"},
    ]
    assert pairs(filter_messages_for_memory(raw)) == [("user", "hi"), ("assistant", "hello")]


def test_hidden_message_with_valid_human_input_response_is_kept() -> None:
    raw = [
        {"role": "user", "content": "Tuesday", "hidden": True, "human_input_response": VALID_HIR}
    ]
    assert pairs(filter_messages_for_memory(raw)) == [("user", "Tuesday")]


@pytest.mark.parametrize(
    "response",
    [
        {**VALID_HIR, "version": 2},
        {**VALID_HIR, "version": True},
        {**VALID_HIR, "kind": "other"},
        {**VALID_HIR, "source": "  "},
        {**VALID_HIR, "request_id": None},
        {**VALID_HIR, "value": ""},
        {**VALID_HIR, "response_kind": "option"},  # an option without option_id
        {**VALID_HIR, "response_kind": "option", "option_id": " "},
        {**VALID_HIR, "response_kind": "checkbox"},
        "not a mapping",
    ],
)
def test_invalid_human_input_response_does_not_save_a_hidden_message(response: object) -> None:
    assert is_valid_human_input_response(response) is False
    raw = [{"role": "user", "content": "x", "hidden": True, "human_input_response": response}]
    assert filter_messages_for_memory(raw) == []


def test_option_response_with_option_id_is_valid() -> None:
    assert is_valid_human_input_response({**VALID_HIR, "response_kind": "option", "option_id": "b"})


def test_upload_only_turn_and_its_reply_are_dropped() -> None:
    raw = [
        {"role": "user", "content": UPLOAD},
        {"role": "assistant", "content": "I see a PDF."},
        {"role": "user", "content": "I prefer short answers"},
        {"role": "assistant", "content": "Noted."},
    ]
    assert pairs(filter_messages_for_memory(raw)) == [
        ("user", "I prefer short answers"),
        ("assistant", "Noted."),
    ]


def test_hidden_message_and_tool_steps_do_not_reset_the_upload_skip() -> None:
    raw = [
        {"role": "user", "content": UPLOAD},
        {"role": "user", "content": "reminder", "hidden": True},
        {"role": "assistant", "content": "", "tool_calls": [{"id": "c"}]},
        {"role": "assistant", "content": "Summary of the PDF"},
        {"role": "assistant", "content": "Anything else?"},
    ]
    assert pairs(filter_messages_for_memory(raw)) == [("assistant", "Anything else?")]


def test_upload_block_is_stripped_and_the_reply_kept() -> None:
    raw = [
        {"role": "user", "content": [{"type": "text", "text": UPLOAD + "Summarise it please "}]},
        {"role": "assistant", "content": "It says…"},
    ]
    assert pairs(filter_messages_for_memory(raw)) == [
        ("user", "Summarise it please"),
        ("assistant", "It says…"),
    ]


def test_upload_regex_is_case_insensitive_once_the_marker_is_present() -> None:
    text = "<uploaded_files>a</uploaded_files>x <UPLOADED_FILES>b</UPLOADED_FILES>y"
    raw = [{"role": "user", "content": text}]
    assert pairs(filter_messages_for_memory(raw)) == [("user", "x y")]


def test_langchain_like_objects() -> None:
    raw = [
        LCMessage("system", "sys"),
        LCMessage("human", "hidden", additional_kwargs={"hide_from_ui": True}),
        LCMessage(
            "human",
            "Tuesday",
            id="h1",
            additional_kwargs={"hide_from_ui": True, "human_input_response": VALID_HIR},
        ),
        LCMessage("ai", "calling", tool_calls=[{"name": "t"}]),
        LCMessage("tool", "result"),
        LCMessage("ai", "Booked for Tuesday", id="a1"),
    ]
    out = filter_messages_for_memory(raw)
    assert pairs(out) == [("user", "Tuesday"), ("assistant", "Booked for Tuesday")]
    assert [m.id for m in out] == ["h1", "a1"]


def test_empty_ai_message_is_kept() -> None:
    raw = [{"role": "user", "content": "q"}, {"role": "assistant", "content": ""}]
    assert pairs(filter_messages_for_memory(raw)) == [("user", "q"), ("assistant", "")]


@pytest.mark.parametrize(
    "raw",
    [
        "not a list",
        None,
        {"role": "user", "content": "a dict, not a list"},
        [{"content": "no role"}],
        [{"role": 3, "content": "x"}],
        [object()],
        [{"role": "user", "content": 42}],
    ],
)
def test_unknown_shapes_raise_invalid_messages(raw: Any) -> None:
    with pytest.raises(InvalidMessages):
        filter_messages_for_memory(raw)


@pytest.mark.parametrize(
    ("roles", "expected"),
    [
        ((), False),
        (("user",), False),
        (("assistant", "assistant"), False),
        (("assistant", "user"), True),
        (("user", "user", "assistant"), True),
    ],
)
def test_minimum_dialogue(roles: tuple[Any, ...], expected: bool) -> None:
    assert has_minimum_dialogue([Message(role, "x") for role in roles]) is expected
