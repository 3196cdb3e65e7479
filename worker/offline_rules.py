"""The offline extractor's rules: what each pattern of a user's sentence says about them, and the
checks that keep a match from being read into a joke, a quote or someone else's words.

A :class:`Rule` is a pattern, a template for the fact and its category and confidence; the table
is tried in order and the first rule that holds wins (corrections first, so "no, use X instead of
Y" is not read as a preference). :mod:`worker.offline` splits messages into sentences and applies
the table.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

_I = re.IGNORECASE
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
# "I'm not sure, but …": doubt, not a correction; "…, but I think so": no new identity.
_UNSURE = re.compile(
    r"^(?:so |that |too |really |quite |entirely )?(?:sure|certain|convinced|"
    r"positive|kidding|joking|saying|asking)\b",
    _I,
)
_I_CLAUSE = re.compile(r"^(?:i|we|you|it|that|this)\b", _I)
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


def is_instruction(text: str, start: int) -> bool:
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
