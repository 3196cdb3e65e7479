"""`memq eval`'s scripted model for the scripted OpenAI-compatible server: a responder
(``ScriptedOpenAI.responder``) that extracts, answers and judges deterministically."""

from __future__ import annotations

import json
import re
from typing import Any

from memq.testing.openai_server import slot_body
from memq.testing.relative_dates import message_days, resolve_relative
from memq.testing.replies import Reply

# --- `memq eval`'s scripted model: extracts, answers and judges deterministically ---------------
# Kept apart from the server so that other behaviours can be added without touching it.
# Extraction: every user line of the update prompt's <conversation> slot that is not a question
# becomes a fact, word for word (a leading "[date]" and "Name:" dropped; a relative time in it
# resolved against its message's day as its eventDate). Answer: the remembered
# fact sharing the most content words with the question (the first such on a tie), else "The
# information is not available." Judge: an unanswerable question is correct when the answer says
# "not available"; any other when every content word of the gold answer is in the answer. Usage
# is the character estimate of what was sent and answered, so token counts are computable.


_EVAL_DATE = re.compile(r"^\[[^\]]*\]\s*")
_EVAL_NAME = re.compile(r"^[A-Z][\w-]*:\s+")
_EVAL_FACT_LINE = re.compile(r"^- \[[^\]]*\] (.*)$", re.MULTILINE)
_EVAL_FIELD = re.compile(
    r"^(Question|Gold answer|Correct Answer|Rubric|Explanation|"
    r"Generated answer|Model Response): (.*)$",
    re.MULTILINE,
)
NOT_AVAILABLE = "The information is not available."


def _eval_reply(request: dict[str, Any], content: str) -> Reply:
    from prompts.tokens import estimate_tokens

    sent = "\n".join(str(m.get("content", "")) for m in request.get("messages", []))
    return Reply(
        content=content,
        prompt_tokens=estimate_tokens(sent),
        completion_tokens=estimate_tokens(content),
    )


def _eval_fields(text: str) -> dict[str, str]:
    return {str(name): str(value) for name, value in _EVAL_FIELD.findall(text)}


def eval_extracted_facts(conversation: str) -> list[tuple[str, str | None]]:
    """The facts the scripted extraction finds in a ``<conversation>`` slot, each with the
    citation label of the line it came from (``[m1] User: …``; None for an unlabelled line)."""
    facts: list[tuple[str, str | None]] = []
    for line in conversation.splitlines():
        label = None
        if line.startswith("[m") and "] " in line:
            label, line = line[1 : line.index("] ")], line[line.index("] ") + 2 :]
        if not line.startswith("User: "):
            continue
        text = _EVAL_NAME.sub("", _EVAL_DATE.sub("", line.removeprefix("User: ").strip()))
        if text and not text.endswith("?"):
            facts.append((text, label))
    return facts


def evaluation_responder(request: dict[str, Any]) -> Reply:
    """The responder for `memq eval` tests: extraction, answers and verdicts, all scripted."""
    from memq.evaluation.prompts import ANSWER_SYSTEM, JUDGE_SYSTEM
    from memq.evaluation.scoring import content_words

    messages = request.get("messages", [])
    system = str(messages[0].get("content", "")) if messages else ""
    user = str(messages[-1].get("content", "")) if messages else ""
    if system == ANSWER_SYSTEM:
        question = _eval_fields(user).get("Question", "")
        wanted = content_words(question)
        best, answer = 0, NOT_AVAILABLE
        for fact in _EVAL_FACT_LINE.findall(user):
            shared = len(wanted & content_words(fact))
            if shared > best:
                best, answer = shared, fact
        return _eval_reply(request, answer)
    if system == JUDGE_SYSTEM:
        fields = _eval_fields(user)
        response = fields.get("Generated answer", fields.get("Model Response", ""))
        unanswerable = "Explanation" in fields or "cannot be answered" in user
        if unanswerable:
            correct = "not available" in response.lower()
        else:
            gold = content_words(
                fields.get("Gold answer", fields.get("Correct Answer", fields.get("Rubric", "")))
            )
            correct = bool(gold) and gold <= content_words(response)
        if "Gold answer" in fields:  # LoCoMo's judge answers JSON
            label = "CORRECT" if correct else "WRONG"
            return _eval_reply(request, json.dumps({"reason": "scripted", "label": label}))
        return _eval_reply(request, "yes" if correct else "no")
    found = slot_body(user, "conversation")
    facts = eval_extracted_facts(found) if found is not None else []
    days = message_days(found or "")
    new_facts: list[dict[str, Any]] = []
    for text, cite in facts:
        item: dict[str, Any] = {
            "content": text,
            "category": "context",
            "confidence": 0.95,
            "cites": [cite] if cite else [],
        }
        # A relative time resolved against the message's day, as the prompt asks.
        event = resolve_relative(text, days[cite]) if cite is not None and cite in days else None
        if event is not None:
            item["eventDate"] = event.isoformat()
        new_facts.append(item)
    update = {"user": {}, "history": {}, "newFacts": new_facts, "factsToRemove": []}
    return _eval_reply(request, json.dumps(update))
