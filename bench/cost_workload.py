"""COST's workload: the users, their seeded memories, their sessions, and the scripted model that
answers them, with the two checks every variant is held to (the facts learnt, the duplicates left).

Each user starts with 60 facts (~3,000 tokens of memory, the size measured on LoCoMo's real
conversations). Each session is a new thread of a few turns; every turn mentions a new item (one
fact to learn), and one turn of each session restates, in other words, one of the user's seeded
facts. The model answers as a real one does: a fact per new item, and for a restatement a new
fact only when the fact it restates is not in the prompt's ``<current_memory>`` — a model cannot
avoid re-adding what it is not shown, and its paraphrase is not caught by deduplication on exact
content. A restated seeded fact stored twice is a *missed duplicate*.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any

from memq.core.settings import MemqSettings
from memq.testing.openai_server import memory_facts, request_text, slot_body
from memq.testing.replies import Reply
from storage import get_storage
from storage.document import Fact, MemoryDocument

SEEDED_FACTS = 60  # ~3,000 tokens of memory per user, as on LoCoMo's real conversations
RESTATING_TURN = 1  # the turn of each session that restates a seeded fact
ITEM = re.compile(r"item-\d+-\d+-\d+")
# A restatement as the user says it, and the fact a model writes from it when it cannot see the
# seeded one: other words for the same thing.
RESTATED = re.compile(r"on p(\d+) I use (\d+)-space indents and look at pull requests every (\d+)")
PARAPHRASE = re.compile(r"^Uses \d+-space indents in project p(\d+)\b")


@dataclass(frozen=True)
class Workload:
    users: int
    sessions: int
    turns: int

    @property
    def messages(self) -> int:
        """Messages handed over in all (a user and an assistant message per turn)."""
        return self.users * self.sessions * self.turns * 2


def user_id(user: int) -> str:
    return f"user-{user}"


def seeded_content(user: int, n: int) -> str:
    return (
        f"User {user} fact {n}: prefers {n % 7 + 2}-space indentation in project p{n} "
        f"and reviews pull requests every {n % 5 + 1} days before standup"
    )


def restated_fact(user: int, number: int) -> int:
    """Which seeded fact the user restates in session ``number`` (a different one each time)."""
    return (user * 7 + number * 17 + 3) % SEEDED_FACTS


def seed_memories(settings: MemqSettings, client: Any, users: int) -> None:
    storage = get_storage(settings, redis=client)
    for user in range(users):
        facts = [Fact(content=seeded_content(user, n), confidence=0.9) for n in range(SEEDED_FACTS)]
        storage.save(user_id(user), None, MemoryDocument(facts=facts))


def session(user: int, number: int, turns: int) -> list[dict[str, str]]:
    """The messages of one session (one thread), in order."""
    messages = []
    for turn in range(turns):
        item = f"item-{user}-{number}-{turn}"
        said = (
            f"Session {number}, turn {turn}: I just bought {item}; it is a second-hand road "
            "bike with a carbon frame and I plan to ride it to work three days a week, so "
            "please remember it."
        )
        if turn == RESTATING_TURN:
            n = restated_fact(user, number)
            said += (
                f" By the way, on p{n} I use {n % 7 + 2}-space indents and look at pull requests "
                f"every {n % 5 + 1} days."
            )
        messages.append({"role": "user", "content": said})
        messages.append({"role": "assistant", "content": f"Noted: you own {item}. Enjoy it!"})
    return messages


def answer(request: dict[str, Any]) -> Reply:
    """The scripted model: what the new conversation teaches that the memory shown lacks."""
    conversation = slot_body(request_text(request), "conversation") or ""
    shown = " ".join(str(f.get("content", "")) for f in memory_facts(request))
    facts = [
        {"content": f"The user owns {i}", "category": "context", "confidence": 0.9}
        for i in sorted(set(ITEM.findall(conversation)))
    ]
    for n, spaces, days in RESTATED.findall(conversation):
        if f"project p{n} " in shown:
            continue  # it can see the fact: nothing new to add
        facts.append(
            {
                "content": f"Uses {spaces}-space indents in project p{n} and looks at pull "
                f"requests every {days} days",
                "category": "preference",
                "confidence": 0.9,
            }
        )
    items = ", ".join(ITEM.findall(conversation)) or "nothing new"
    body = {
        # As real models do, the summary of what the user is focused on now is rewritten each time.
        "user": {
            "topOfMind": {"summary": f"Currently thinking about {items}.", "shouldUpdate": True}
        },
        "history": {},
        "newFacts": facts,
        "factsToRemove": [],
    }
    return Reply(content=json.dumps(body), completion_tokens=60 + 25 * len(facts))


def learnt_items(document: MemoryDocument) -> list[str]:
    """The item facts a memory holds (what every variant must learn alike)."""
    return sorted(f.content for f in document.facts if "item-" in f.content)


def missed_duplicates(document: MemoryDocument, user: int) -> int:
    """Restated seeded facts the memory holds twice: the original and a paraphrase of it."""
    seeded = {
        n
        for n in range(SEEDED_FACTS)
        if any(f.content == seeded_content(user, n) for f in document.facts)
    }
    paraphrased = {
        int(found.group(1))
        for f in document.facts
        if (found := PARAPHRASE.match(f.content)) is not None
    }
    return len(seeded & paraphrased)
