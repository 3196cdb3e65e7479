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
from collections.abc import Iterator

from memq.memory.update import NewFact, UpdateAnswer
from prompts.tokens import TokenCounter
from prompts.update_prompt import UpdatePrompt
from worker.introductions import introduction_facts
from worker.model import ModelAnswer
from worker.offline_rules import RULES, is_instruction

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
# "I love you", "I like it.", "I like how you explained that", "We chose it because …": a capture
# that starts with a pronoun or a demonstrative points into the conversation, not at a fact.
_DEICTIC = re.compile(
    r"^(?:it|its|it['’]s|that|this|these|those|you|your|yours|how|what|why|when|where|which|who|"
    r"whom|them|him|her|us|he|she|they|me|there|here)\b",
    _I,
)
_JOKING = re.compile(r"\b(?:lol|lmao|rofl|haha\w*|jk|brb)\b", _I)
_PRONOUNS = ((re.compile(r"\bmy\b", _I), "their"), (re.compile(r"\bme\b", _I), "them"))


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
            if rule.category == "correction" and not is_instruction(sentence, match.start()):
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
        # Each fact cites the message it was read from, so its source — and when it was said —
        # is that message's.
        labels = prompt.labels if len(prompt.labels) == len(prompt.conversation) else ()
        facts = [
            fact.model_copy(update={"cites": labels[index : index + 1]})
            for index, message in enumerate(prompt.conversation)
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
