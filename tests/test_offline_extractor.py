"""The offline rules extractor on English and Chinese sentences: what it must and must not
extract, and that its answer goes through the same parser and apply as a model's."""

from __future__ import annotations

import logging
from datetime import UTC, datetime

import pytest

from memq.core.identity import ContextKey
from memq.core.models import ConversationContext, Message
from memq.core.settings import MemqSettings
from prompts.answer import parse_update_response
from prompts.update_prompt import UpdatePrompt
from tests.support.memory_storage import InMemoryStorage
from worker import offline
from worker.offline import RulesUpdateModel, extract_facts
from worker.pipeline import ExtractionPipeline

EXTRACTED = [
    # (user sentence, category, content, sourceError)
    (
        "I prefer dark mode in my editor.",
        "preference",
        "User prefers dark mode in their editor",
        None,
    ),
    ("I really like TypeScript", "preference", "User likes TypeScript", None),
    ("I hate long meetings!", "preference", "User dislikes long meetings", None),
    ("I don’t like Java.", "preference", "User dislikes Java", None),
    ("I'm a big fan of Rust.", "preference", "User likes Rust", None),
    ("I am a data scientist at Acme.", "context", "User is a data scientist at Acme", None),
    ("I'm an engineer at Acme.", "context", "User is an engineer at Acme", None),
    ("I work for Google.", "context", "User works at Google", None),
    ("I want to learn Rust this year.", "goal", "User's goal: learn Rust this year", None),
    ("You should never use tabs.", "correction", "Avoid using tabs", None),
    ("I told you, stop using mocks.", "correction", "Avoid using mocks", None),
    ("I work as a nurse.", "context", "User works as a nurse", None),
    ("My goal is to ship v2 by March.", "goal", "User's goal: ship v2 by March", None),
    ("Let's go with PostgreSQL.", "context", "Decided to use PostgreSQL", None),
    ("We decided to migrate to Kubernetes.", "context", "Decided to migrate to Kubernetes", None),
    ("No, use pnpm instead of npm.", "correction", "Use pnpm instead of npm", "Used npm"),
    ("That's wrong. Don't use mocks in tests.", "correction", "Avoid using mocks in tests", None),
    ("我喜欢用Python写脚本。", "preference", "用户喜欢用Python写脚本", None),
    ("我不喜欢冗长的回答", "preference", "用户不喜欢冗长的回答", None),
    ("我是一名后端工程师", "context", "用户是后端工程师", None),
    ("我在字节跳动工作。", "context", "用户在字节跳动工作", None),
    ("我的目标是三个月内学会Rust", "goal", "用户的目标：三个月内学会Rust", None),
    ("就用 uv 吧", "context", "决定使用uv", None),
    ("不要用pip，改用uv", "correction", "使用uv，不要用pip", "用了pip"),
    # "not X, Y" corrections of who the user is, and of what was said
    (
        "I'm not vegetarian, I'm vegan.",
        "correction",
        "User is vegan, not vegetarian",
        "Took the user for vegetarian",
    ),
    (
        "I am not a student but a teacher",
        "correction",
        "User is a teacher, not a student",
        "Took the user for a student",
    ),
    (
        "我不是素食者，我是纯素食者",
        "correction",
        "用户是纯素食者，不是素食者",
        "误以为用户是素食者",
    ),
    ("我不是学生而是老师。", "correction", "用户是老师，不是学生", "误以为用户是学生"),
    ("不是周二，是周三", "correction", "应该是周三，不是周二", "以为是周二"),
    # a bare name
    ("Hi, I'm Carol.", "context", "User's name is Carol", None),
    ("我叫李娜", "context", "用户叫李娜", None),
]

INTRODUCTIONS = [
    (
        "I'm Carol, a nurse living in Toronto.",
        ["User's name is Carol", "User is a nurse living in Toronto"],
    ),
    ("My name is Ana Lopez, a pilot", ["User's name is Ana Lopez", "User is a pilot"]),
    ("I'm Bob from Lyon", ["User's name is Bob", "User is from Lyon"]),
    (
        "I'm Eve, a chef in Rome, and I prefer tea",
        ["User's name is Eve", "User is a chef in Rome"],
    ),
    ("我是王伟，一名后端工程师", ["用户叫王伟", "用户是后端工程师"]),
    ("我是王伟，住在上海。", ["用户叫王伟", "用户住在上海"]),
    ("我叫陈静，一位设计师", ["用户叫陈静", "用户是设计师"]),
]

NOTHING = [
    "Do you like Python?",
    "Can you prefer shorter answers?",
    "If I were rich I would buy a boat.",
    "I am not sure.",
    "I'm a bit tired today.",
    "I want to know how this works.",
    "I'm going to the store.",
    "I don't use Windows.",
    "I would like you to summarise this.",
    "The weather is nice.",
    # negated, reported and quoted instructions are not the user's correction
    "Don't stop using the cache",
    "He told me I should never use tabs",
    'The style guide says "never use global variables".',
    'Someone wrote "never use global variables" on the board.',
    # a capture that points into the conversation, not at a fact
    "I love you",
    "I like it.",
    "I like how you explained that",
    "I prefer that you answer shortly",
    "We chose it because it was cheap",
    # politeness and the near future are not goals
    "I want to thank you",
    "I am going to lunch now, brb",
    "I'm going to need more details",
    # self-deprecation and jokes are not an identity or an employer
    "I'm an idiot, sorry",
    "I work for food lol",
    "你喜欢Go吗？",
    "我是说这个不行",
    "不对称的设计很好看",
    "如果我喜欢Java会怎样",
    # not names, not corrections
    "I'm French.",
    "I'm Sorry, I forgot",
    "I'm not sure, maybe later",
    "I'm not sure but I think so",
    "I'm not a fan, but I use it",
    "我是学生，在北京读书",
]


@pytest.mark.parametrize(("text", "category", "content", "source_error"), EXTRACTED)
def test_explicit_statements_are_extracted(
    text: str, category: str, content: str, source_error: str | None
) -> None:
    (fact,) = extract_facts(text)
    assert (fact.category, fact.content) == (category, content)
    assert fact.source_error == source_error
    assert fact.confidence >= 0.7  # passes the default threshold


@pytest.mark.parametrize(("text", "contents"), INTRODUCTIONS)
def test_self_introductions_give_the_name_and_the_rest(text: str, contents: list[str]) -> None:
    facts = extract_facts(text)
    assert [f.content for f in facts] == contents
    assert {f.category for f in facts} == {"context"}
    assert all(f.confidence >= 0.9 for f in facts)


@pytest.mark.parametrize("text", NOTHING)
def test_questions_hypotheticals_and_small_talk_give_nothing(text: str) -> None:
    assert extract_facts(text) == []


def test_it_reads_only_the_user_and_feeds_the_normal_pipeline() -> None:
    context = ConversationContext(
        key=ContextKey.create("t1", "alice", None),
        messages=(
            Message("user", "I prefer tabs. Do you like Go?"),
            Message("assistant", "I prefer spaces, and I am a language model."),
        ),
    )
    settings = MemqSettings(llm_provider="rules")
    storage = InMemoryStorage()
    report = ExtractionPipeline(
        settings,
        storage,
        RulesUpdateModel(count_tokens=len),
        count_tokens=len,
        clock=lambda: datetime(2026, 7, 15, tzinfo=UTC),
    ).run(context)
    memory = storage.load("alice", None)
    assert [f.content for f in memory.facts] == ["User prefers tabs"]
    assert memory.facts[0].source_thread_id == "t1"
    assert [c.action for c in report.changes] == ["add"]
    assert report.model == "memq-rules" and report.prompt_tokens > 0


def test_it_says_it_is_not_an_llm(caplog: pytest.LogCaptureFixture) -> None:
    offline._announce.cache_clear()
    with caplog.at_level(logging.WARNING, logger="worker.offline"):
        RulesUpdateModel()
        RulesUpdateModel()
    warnings = [r for r in caplog.records if "not an LLM" in r.getMessage()]
    assert len(warnings) == 1 and warnings[0].levelno == logging.WARNING


def test_answer_is_valid_json_of_the_update_schema() -> None:
    prompt = UpdatePrompt(system="", user="", conversation=(Message("user", "I hate tabs"),))
    text = RulesUpdateModel().propose(prompt).text
    assert [f.content for f in parse_update_response(text).new_facts] == ["User dislikes tabs"]
