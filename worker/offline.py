"""The offline extractor: deterministic rules instead of an LLM, so memq runs with no model at all.

It reads only what the user said (English and Chinese): preferences and dislikes,
self-introductions, identity and role, goals, decisions, and corrections ("use X instead of Y",
"I'm not X, I'm Y"). It answers with the same answer model as an LLM, so everything after it —
parsing, apply, storage — is exercised unchanged. It never writes summaries and never removes
facts: rules cannot tell a contradiction from a nuance. Questions and hypotheticals are skipped,
since "do you like Rust?" says nothing about the user.
"""

from __future__ import annotations

import functools
import json
import logging
import re
from collections.abc import Callable, Iterator
from dataclasses import dataclass

from memq.memory.update import NewFact, UpdateAnswer
from prompts.tokens import TokenCounter
from prompts.update_prompt import UpdatePrompt
from worker.introductions import introduction_facts
from worker.model import ModelAnswer

log = logging.getLogger(__name__)

MODEL_NAME = "memq-rules"
_I = re.IGNORECASE
_SENTENCES = re.compile(r"[^.!?;。！？；\n]+[.!?;。！？；]*")
# Rules with a lazy group before a literal ("use X instead of Y") cost the square of a sentence's
# length; a statement the rules can read is far shorter, so a longer run is not read at all.
_MAX_SENTENCE_CHARS = 500
_QUESTION_START = re.compile(
    r"^\s*(?:do|does|did|can|could|would|will|should|is|are|am|what|why|how|which|who|when|where)\b",
    _I,
)
_HYPOTHETICAL = re.compile(r"^\s*(?:if|suppose|imagine|what if)\b|如果|假如|假设", _I)
# Trailing punctuation, and the Chinese sentence-final particles ("就用 uv 吧").
_TRAILING = re.compile(r"(?:[\s.,!?;:。，！？；：、…]|(?<=\S)\s*[吧啊呀哦])+$")
_LEADING = re.compile(r"^[\s,:，：]+")
_NOT_A_ROLE = re.compile(
    r"^(?:an? )?(?:bit|little|lot|few|big fan|huge fan|fan|idiot|fool|moron|dummy|mess|"
    r"genius|joke)\b",
    _I,
)
# "I want to thank you", "I hope to hear from you": politeness, not a goal.
_NOT_A_GOAL = re.compile(
    r"^(?:the|a|an|my|your|know|ask|see|check|understand|say|be sure|make sure|thank|thanks|"
    r"apologi[sz]e|hear|add|mention|note|clarify|confirm|tell|share|point out|talk|chat|need|"
    r"let)\b",
    _I,
)
# "I love you", "I like it.", "I like how you explained that", "We chose it because …": a capture
# that starts with a pronoun or a demonstrative points into the conversation, not at a fact.
_DEICTIC = re.compile(
    r"^(?:it|its|it['’]s|that|this|these|those|you|your|yours|how|what|why|when|where|which|who|"
    r"whom|them|him|her|us|he|she|they|me|there|here)\b",
    _I,
)
# "I'm not sure, but …": doubt, not a correction; "…, but I think so": no new identity.
_UNSURE = re.compile(
    r"^(?:so |that |too |really |quite |entirely )?(?:sure|certain|convinced|"
    r"positive|kidding|joking|saying|asking)\b",
    _I,
)
_I_CLAUSE = re.compile(r"^(?:i|we|you|it|that|this)\b", _I)
_JOKING = re.compile(r"\b(?:lol|lmao|rofl|haha\w*|jk|brb)\b", _I)
_NOT_AN_EMPLOYER = re.compile(
    r"^(?:food|free|fun|money|nothing|peanuts|myself|tips|a living)\b", _I
)
# "Don't stop using the cache": a negated "stop using" asks to keep using it.
_NEGATED = re.compile(
    r"\b(?:don['’]t|do not|never|not|no need to|didn['’]t|won['’]t|wouldn['’]t)\s*$", _I
)
# "He told me I should never use tabs", "the guide says never use X": someone else's rule.
_REPORTED = re.compile(
    r"\b(?:told|tells|said|says|saying|asked|asks|according to|heard|read|reads|wrote|writes|"
    r"claims?|claimed|thinks?|thought|believes?|believed)\b",
    _I,
)
_MY_OWN_WORDS = re.compile(r"\b(?:i|we)\s+(?:already\s+|just\s+)?(?:told|said|asked)\b", _I)
_PRONOUNS = ((re.compile(r"\bmy\b", _I), "their"), (re.compile(r"\bme\b", _I), "them"))


@dataclass(frozen=True)
class Rule:
    pattern: re.Pattern[str]
    template: str  # formatted with the pattern's named groups
    category: str
    confidence: float
    source_error: str | None = None  # formatted like template
    check: Callable[[dict[str, str]], bool] | None = None


def _en(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern.replace("'", "['’]"), _I)


def _not_after_subject(text: str, start: int) -> bool:
    # "don't use X" instructs the assistant; "I don't use X" or "I should never use X" is a
    # statement about the user.
    before = text[:start]
    return (
        re.search(
            r"\b(?:i|we|they|he|she)\s+(?:(?:should|must|will|would|can|could|might|may|"
            r"shall)\s+)?$|\b(?:i|we|they|he|she)\s*$",
            before,
            _I,
        )
        is None
    )


def _inside_quotes(text: str, start: int) -> bool:
    before = text[:start]
    return before.count('"') % 2 == 1 or before.count("“") > before.count("”")


def _is_instruction(text: str, start: int) -> bool:
    """A correction rule's match is the user's own instruction, not a negated, reported or
    quoted one, and not a statement about someone."""
    before = text[:start]
    if not _not_after_subject(text, start) or _NEGATED.search(before) is not None:
        return False
    if _inside_quotes(text, start):
        return False
    return _REPORTED.search(before) is None or _MY_OWN_WORDS.search(before) is not None


RULES: tuple[Rule, ...] = (
    # corrections (checked first: "no, use X instead of Y" is not a preference)
    # "I'm not vegetarian, I'm vegan", "I am not a student but a teacher"
    Rule(
        _en(
            r"\bi(?:'m| am) not (?P<bad>[^,;]+?)"
            r"(?:,\s*(?:but\s+)?i(?:'m| am)\s+|\s+but\s+(?:i(?:'m| am)\s+)?)(?P<good>.+)"
        ),
        "User is {good}, not {bad}",
        "correction",
        0.95,
        "Took the user for {bad}",
        check=lambda g: _UNSURE.match(g["bad"]) is None and _I_CLAUSE.match(g["good"]) is None,
    ),
    # "我不是素食者，我是纯素食者"
    Rule(
        re.compile(r"我不是(?P<bad>[^，,。]+?)[，,]?\s*(?:而|我|而我)?是(?P<good>.+)"),
        "用户是{good}，不是{bad}",
        "correction",
        0.95,
        "误以为用户是{bad}",
    ),
    # "不是周二，是周三": a correction of what was said, not of the user
    Rule(
        re.compile(r"(?:^|[，,。\s])不是(?P<bad>[^，,。]+?)[，,]\s*(?:而)?是(?P<good>.+)"),
        "应该是{good}，不是{bad}",
        "correction",
        0.95,
        "以为是{bad}",
    ),
    Rule(
        _en(r"\buse (?P<good>.+?) instead of (?P<bad>.+)"),
        "Use {good} instead of {bad}",
        "correction",
        0.95,
        "Used {bad}",
    ),
    Rule(
        _en(r"\b(?:don't|do not|never|stop) (?:use|using) (?P<bad>.+)"),
        "Avoid using {bad}",
        "correction",
        0.95,
    ),
    Rule(
        re.compile(
            r"(?:不要|别|不用)(?:再)?用(?P<bad>[^，,]+)[，,]\s*(?:要|请)?(?:改用|用|换成)(?P<good>.+)"
        ),
        "使用{good}，不要用{bad}",
        "correction",
        0.95,
        "用了{bad}",
    ),
    Rule(
        re.compile(r"(?:应该用|改用|换成)(?P<good>.+?)[，,]?\s*(?:而不是|不是)(?P<bad>.+)"),
        "使用{good}，不要用{bad}",
        "correction",
        0.95,
        "用了{bad}",
    ),
    Rule(
        re.compile(r"(?:不要|别)(?:再)?(?:用|使用)(?P<bad>.+)"), "避免使用{bad}", "correction", 0.95
    ),
    Rule(re.compile(r"不对[，,。!！]\s*应该(?P<good>.+)"), "应该{good}", "correction", 0.95),
    # dislikes before likes ("I don't like" contains "like")
    Rule(
        _en(
            r"\bi (?:really )?(?:hate|dislike|don't like|do not like|can't stand|cannot stand) "
            r"(?P<x>.+)"
        ),
        "User dislikes {x}",
        "preference",
        0.9,
    ),
    Rule(
        re.compile(r"我(?:很|非常|真的)?(?:不喜欢|讨厌|不爱用|受不了)(?P<x>.+)"),
        "用户不喜欢{x}",
        "preference",
        0.9,
    ),
    Rule(
        _en(r"\bi(?:'m| am) a (?:big |huge )?fan of (?P<x>.+)"), "User likes {x}", "preference", 0.9
    ),
    Rule(
        _en(r"\bmy (?:favorite|favourite) (?P<what>[\w -]{2,30}?) is (?P<x>.+)"),
        "User's favorite {what} is {x}",
        "preference",
        0.9,
    ),
    Rule(
        _en(r"\bi (?:really |much |strongly )?(?:prefer|favor|favour) (?P<x>.+)"),
        "User prefers {x}",
        "preference",
        0.9,
    ),
    Rule(_en(r"\bi(?:'d| would) rather (?P<x>.+)"), "User would rather {x}", "preference", 0.85),
    Rule(
        _en(r"\bi (?:really )?(?:like|love|enjoy) (?P<x>.+)"), "User likes {x}", "preference", 0.9
    ),
    Rule(
        re.compile(r"我最喜欢的(?P<what>.{1,10}?)是(?P<x>.+)"),
        "用户最喜欢的{what}是{x}",
        "preference",
        0.9,
    ),
    Rule(
        re.compile(r"我(?:比较|更|很|最|非常|一直)?(?:喜欢|偏好|爱用|倾向于)(?P<x>.+)"),
        "用户喜欢{x}",
        "preference",
        0.9,
    ),
    # identity and role
    Rule(
        _en(r"\bi(?:'m| am) (?P<x>(?:a|an) [a-z][\w -]{2,60})"),
        "User is {x}",
        "context",
        0.9,
        check=lambda g: _NOT_A_ROLE.match(g["x"]) is None,
    ),
    Rule(_en(r"\bi work as (?P<x>.+)"), "User works as {x}", "context", 0.9),
    Rule(
        _en(r"\bmy (?:job|role|profession|title) is (?P<x>.+)"), "User works as {x}", "context", 0.9
    ),
    Rule(
        _en(r"\bi work (?:at|for) (?P<x>.+)"),
        "User works at {x}",
        "context",
        0.9,
        check=lambda g: _NOT_AN_EMPLOYER.match(g["x"]) is None,
    ),
    Rule(re.compile(r"我是(?:一名|一个|一位|个)(?P<x>.+)"), "用户是{x}", "context", 0.9),
    Rule(re.compile(r"我的(?:职业|工作|职位)是(?P<x>.+)"), "用户的职业是{x}", "context", 0.9),
    Rule(re.compile(r"我(?:担任|是做)(?P<x>.+)"), "用户担任{x}", "context", 0.9),
    Rule(re.compile(r"我在(?P<x>.+?)(?:工作|上班)"), "用户在{x}工作", "context", 0.9),
    # goals
    Rule(
        _en(
            r"\b(?:my goal is to|i plan to|i'm planning to|i am planning to|i intend to|i aim to|"
            r"i want to|i hope to) (?P<x>.+)"
        ),
        "User's goal: {x}",
        "goal",
        0.85,
        check=lambda g: _NOT_A_GOAL.match(g["x"]) is None,
    ),
    Rule(
        re.compile(r"(?:我的目标是|我计划|我打算|我准备|接下来我(?:想|要))(?P<x>.+)"),
        "用户的目标：{x}",
        "goal",
        0.85,
    ),
    # decisions
    Rule(
        _en(
            r"\b(?:let's|we'll|we will|we should) (?:go with|use|pick|choose|stick with) (?P<x>.+)"
        ),
        "Decided to use {x}",
        "context",
        0.85,
    ),
    Rule(
        _en(r"\b(?:i|we) (?:have )?(?:decided|chose|opted) to (?P<x>.+)"),
        "Decided to {x}",
        "context",
        0.85,
    ),
    Rule(
        _en(r"\b(?:i|we) (?:decided on|chose|picked|went with|settled on) (?P<x>.+)"),
        "Decided on {x}",
        "context",
        0.85,
    ),
    Rule(
        re.compile(r"(?:就用|决定用|决定使用|我们选择|我选择|我们用)(?P<x>.+)"),
        "决定使用{x}",
        "context",
        0.85,
    ),
)


def _clean(value: str) -> str:
    value = _TRAILING.sub("", _LEADING.sub("", value)).strip()
    for pattern, replacement in _PRONOUNS:
        value = pattern.sub(replacement, value)
    return value[:200]


def _is_question(sentence: str) -> bool:
    stripped = sentence.strip()
    return (
        stripped.endswith(("?", "？", "吗", "吗。", "呢"))
        or _QUESTION_START.match(stripped) is not None
    )


def sentences(text: str) -> Iterator[str]:
    for match in _SENTENCES.finditer(text):
        sentence = match.group(0).strip()
        if (
            sentence
            and len(sentence) <= _MAX_SENTENCE_CHARS
            and not _is_question(sentence)
            and not _HYPOTHETICAL.search(sentence)
            and not _JOKING.search(sentence)
        ):
            yield sentence


def extract_facts(text: str) -> list[NewFact]:
    """The new facts of one user message; at most one rule per sentence."""
    facts: list[NewFact] = []
    for sentence in sentences(text):
        introduced = introduction_facts(sentence)
        if introduced:
            facts.extend(introduced)
            continue
        for rule in RULES:
            match = rule.pattern.search(sentence)
            if match is None:
                continue
            raw = {k: v for k, v in match.groupdict().items() if v is not None}
            if any(_DEICTIC.match(_LEADING.sub("", v)) for v in raw.values()):
                continue
            groups = {k: _clean(v) for k, v in raw.items()}
            if any(len(v) < 2 for v in groups.values()):
                continue
            if rule.check is not None and not rule.check(groups):
                continue
            if rule.category == "correction" and not _is_instruction(sentence, match.start()):
                continue
            error = rule.source_error.format(**groups) if rule.source_error else None
            content = rule.template.format(**groups)
            facts.append(
                NewFact(
                    content=content,
                    category=rule.category,
                    confidence=rule.confidence,
                    source_error=error,
                )
            )
            break
    return facts


@functools.cache
def _announce() -> None:
    log.warning(
        "memq extracts memory with the offline RULES extractor, not an LLM: it only picks up "
        "simple explicit statements. Set MEMQ_LLM_BASE_URL or OPENAI_API_KEY for a real model."
    )


class RulesUpdateModel:
    """An :class:`~worker.model.UpdateModel` that answers from rules."""

    def __init__(self, *, count_tokens: TokenCounter | None = None) -> None:
        self._count = count_tokens
        _announce()

    def propose(self, prompt: UpdatePrompt, *, cache_key: str | None = None) -> ModelAnswer:
        facts = [
            fact
            for message in prompt.conversation
            if message.role == "user"
            for fact in extract_facts(message.content)
        ]
        text = json.dumps(UpdateAnswer(new_facts=tuple(facts)).to_wire(), ensure_ascii=False)
        count = self._count
        return ModelAnswer(
            text=text,
            prompt_tokens=count(prompt.system + prompt.user) if count else 0,
            completion_tokens=count(text) if count else 0,
            model=MODEL_NAME,
        )

    def close(self) -> None:
        return None
