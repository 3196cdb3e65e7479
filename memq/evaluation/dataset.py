"""The typed shape both benchmarks are read into, and how a conversation becomes hand-offs.

A benchmark is conversations (sessions of turns), questions about them and, where the data set
has them, observations: facts a person stated, tied to the turns that state them. Each
conversation is replayed into one memq user per *subject* (a person whose memory is built):
LoCoMo has two speakers and each gets the memory of their own side, the other speaker playing the
assistant (the way the published LoCoMo numbers feed a memory system); LongMemEval has one user
talking to an assistant.
"""

from __future__ import annotations

import re
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from datetime import UTC, datetime
from typing import Literal

from memq.core.errors import MemqError
from memq.core.identity import MAX_USER_ID_LENGTH

Benchmark = Literal["locomo", "longmemeval"]
BENCHMARKS: tuple[Benchmark, ...] = ("locomo", "longmemeval")
ASSISTANT = "assistant"  # the speaker name of LongMemEval's assistant turns
USER = "user"

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]+")


class DatasetError(MemqError, ValueError):
    """The file is not in the benchmark's format: one line naming what is wrong and where."""


@dataclass(frozen=True, slots=True)
class Turn:
    id: str  # LoCoMo's dia_id ("D3:7"); LongMemEval: "<session id>:<index>"
    speaker: str
    text: str


@dataclass(frozen=True, slots=True)
class Session:
    id: str
    date: str  # as the data set writes it
    turns: tuple[Turn, ...]


@dataclass(frozen=True, slots=True)
class Conversation:
    id: str
    sessions: tuple[Session, ...]
    subjects: tuple[str, ...]  # whose memory is built; each becomes one memq user
    named_speakers: bool  # LoCoMo: turns are prefixed with the speaker's name

    @property
    def turn_count(self) -> int:
        return sum(len(s.turns) for s in self.sessions)


@dataclass(frozen=True, slots=True)
class Question:
    id: str
    conversation_id: str
    category: str  # the benchmark's own label ("single-hop", "temporal-reasoning", …)
    question: str
    answer: str
    abstention: bool  # unanswerable by design: correct only when the answer says so
    date: str | None  # when the question is asked (LongMemEval's question_date)
    evidence: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class Observation:
    """A fact the data set says a subject stated, with the turns that state it."""

    conversation_id: str
    subject: str
    session_id: str
    text: str
    evidence: tuple[str, ...]


@dataclass(frozen=True, slots=True)
class EvalSet:
    benchmark: Benchmark
    conversations: tuple[Conversation, ...]
    questions: tuple[Question, ...]
    observations: tuple[Observation, ...] = ()

    def select(self, *, conversations: Sequence[str] = (), limit: int | None = None) -> EvalSet:
        """The named conversations (all when none are named), then the first ``limit`` of them,
        with their questions and observations."""
        chosen = list(self.conversations)
        if conversations:
            known = {c.id for c in chosen}
            missing = [name for name in conversations if name not in known]
            if missing:
                raise DatasetError(f"no conversation {missing[0]!r} in this file")
            wanted = set(conversations)
            chosen = [c for c in chosen if c.id in wanted]
        if limit is not None:
            if limit < 1:
                raise DatasetError("--limit must be at least 1")
            chosen = chosen[:limit]
        ids = {c.id for c in chosen}
        return replace(
            self,
            conversations=tuple(chosen),
            questions=tuple(q for q in self.questions if q.conversation_id in ids),
            observations=tuple(o for o in self.observations if o.conversation_id in ids),
        )


def user_id_for(benchmark: Benchmark, conversation_id: str, subject: str) -> str:
    """A valid memq user id for one subject of one conversation: readable, and unique because
    it ends with a checksum of the exact names (two ids that only differ in unsafe characters
    stay apart)."""
    exact = f"{conversation_id}\x00{subject}".encode("utf-8", "surrogatepass")
    digest = f"{zlib.crc32(exact):08x}"
    readable = _UNSAFE.sub("_", f"{conversation_id}-{subject}").strip("_")[:80] or "x"
    user = f"eval-{benchmark}-{readable}-{digest}"
    return user[:MAX_USER_ID_LENGTH]


def thread_id_for(conversation_id: str, session_id: str) -> str:
    """Each session is its own thread, as a new chat would be."""
    return f"eval:{conversation_id}:{session_id}"


# How the data sets write a session's time: LoCoMo "1:56 pm on 8 May, 2023", LongMemEval
# "2023/05/20 (Sat) 02:21"; read as UTC (neither says a zone).
_SESSION_TIME_FORMATS = ("%I:%M %p on %d %B, %Y", "%Y/%m/%d (%a) %H:%M", "%Y/%m/%d")


def session_time(date: str) -> datetime | None:
    """When a session took place, from the data set's own text; None when it says no time."""
    text = " ".join(date.split())
    for layout in _SESSION_TIME_FORMATS:
        try:
            return datetime.strptime(text, layout).replace(tzinfo=UTC)
        except ValueError:
            continue
    return None


def turn_content(conversation: Conversation, session: Session, index: int) -> str:
    """What one turn says, as handed to memq: the speaker's name where there are two people, and
    — when the session's date is no time memq can read (its messages then carry none) — that
    date before its first turn, so the model can still place events in time."""
    turn = session.turns[index]
    text = f"{turn.speaker}: {turn.text}" if conversation.named_speakers else turn.text
    if index == 0 and session.date and session_time(session.date) is None:
        text = f"[{session.date}] {text}"
    return text


def messages_for(
    conversation: Conversation, session: Session, subject: str
) -> list[dict[str, str]]:
    """The session as OpenAI-style messages seen from ``subject``: their turns are the user's,
    everyone else's the assistant's; each message carries its turn id and, as its
    ``created_at``, the session's time (LoCoMo's ``session_N_date_time``, LongMemEval's
    haystack date)."""
    said = session_time(session.date)
    messages = [
        {
            "role": USER if turn.speaker == subject else ASSISTANT,
            "content": turn_content(conversation, session, index),
            "id": turn.id,
        }
        for index, turn in enumerate(session.turns)
    ]
    if said is not None:
        for message in messages:
            message["created_at"] = said.isoformat()
    return messages


def hand_off_points(messages: Sequence[dict[str, str]]) -> list[int]:
    """Where an agent hook would hand the thread over: after each assistant reply (the end of a
    turn), as message counts; the session's end is always the last point (flushed)."""
    points = [i + 1 for i, m in enumerate(messages) if m["role"] == ASSISTANT and i > 0]
    if not points or points[-1] != len(messages):
        points.append(len(messages))
    return points


def text_field(raw: object, where: str) -> str:
    """A data-set value that must be text (numbers, as LoCoMo has some answers, are read as
    text); anything else is one clear error naming the place. A lone surrogate (JSON can escape
    one) becomes U+FFFD: it cannot be encoded, so it could reach neither Redis nor a model."""
    if isinstance(raw, str):
        return raw.encode("utf-16", "surrogatepass").decode("utf-16", "replace")
    if isinstance(raw, int | float) and not isinstance(raw, bool):
        return str(raw)
    raise DatasetError(f"{where}: expected text, got {type(raw).__name__}")


def id_list(raw: object) -> tuple[str, ...]:
    """Turn ids as a tuple, from a string (``"D1:3"``, ``"D1:3; D2:4"``) or a list of them."""
    items: Iterable[object] = raw if isinstance(raw, list) else [raw]
    found: list[str] = []
    for item in items:
        if isinstance(item, str):
            found.extend(part.strip() for part in re.split(r"[;,]", item) if part.strip())
    return tuple(found)
