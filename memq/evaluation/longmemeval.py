"""LongMemEval (xiaowu0162/LongMemEval, ``longmemeval_s.json`` / ``_m`` / ``_oracle``): a list of
instances, each one question over its own chat history:

``question_id``, ``question_type`` (single-session-user, single-session-assistant,
single-session-preference, temporal-reasoning, knowledge-update, multi-session), ``question``,
``answer``, ``question_date``, ``haystack_session_ids``, ``haystack_dates``,
``haystack_sessions`` (lists of ``{"role", "content"}`` turns, evidence turns marked
``"has_answer": true``) and ``answer_session_ids``. A ``question_id`` ending in ``_abs`` is an
abstention question: the history does not hold the answer, and the right response says so.

Each instance is one conversation here (its haystack replayed into its own user), so every
question is answered from the memory of its own history, as the benchmark defines it.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from memq.evaluation.dataset import (
    ASSISTANT,
    USER,
    Conversation,
    DatasetError,
    EvalSet,
    Question,
    Session,
    Turn,
    text_field,
)

QUESTION_TYPES = (
    "single-session-user",
    "single-session-assistant",
    "single-session-preference",
    "temporal-reasoning",
    "knowledge-update",
    "multi-session",
)
ABSTENTION_MARK = "_abs"


def is_abstention(question_id: str) -> bool:
    return ABSTENTION_MARK in question_id


def read_longmemeval(data: Any) -> EvalSet:
    if not isinstance(data, list):
        raise DatasetError("a LongMemEval file is a JSON list of question instances")
    conversations: list[Conversation] = []
    questions: list[Question] = []
    seen: set[str] = set()
    for index, item in enumerate(data):
        where = f"instance {index + 1}"
        if not isinstance(item, Mapping):
            raise DatasetError(f"{where}: expected an object with `question_id`")
        qid = text_field(item.get("question_id"), f"{where}.question_id")
        where = f"instance {qid!r:.60}"
        if qid in seen:
            raise DatasetError(f"{where}: the question_id appears twice")
        seen.add(qid)
        qtype = text_field(item.get("question_type"), f"{where}.question_type")
        if qtype not in QUESTION_TYPES:
            raise DatasetError(f"{where}: unknown question_type {qtype!r:.40}")
        sessions, evidence = _sessions(item, where)
        conversations.append(Conversation(qid, sessions, (USER,), named_speakers=False))
        date = item.get("question_date")
        questions.append(
            Question(
                id=qid,
                conversation_id=qid,
                category=qtype,
                question=text_field(item.get("question"), f"{where}.question"),
                answer=text_field(item.get("answer"), f"{where}.answer"),
                abstention=is_abstention(qid),
                date=text_field(date, f"{where}.question_date") if date is not None else None,
                evidence=evidence,
            )
        )
    return EvalSet("longmemeval", tuple(conversations), tuple(questions))


def _sessions(item: Mapping[str, Any], where: str) -> tuple[tuple[Session, ...], tuple[str, ...]]:
    raw_sessions = item.get("haystack_sessions")
    if not isinstance(raw_sessions, list):
        raise DatasetError(f"{where}: `haystack_sessions` must be a list")
    ids = item.get("haystack_session_ids") or []
    dates = item.get("haystack_dates") or []
    if not isinstance(ids, list) or not isinstance(dates, list):
        raise DatasetError(f"{where}: `haystack_session_ids` and `haystack_dates` must be lists")
    sessions: list[Session] = []
    evidence: list[str] = []
    used: set[str] = set()
    for number, raw in enumerate(raw_sessions):
        here = f"{where}.haystack_sessions[{number}]"
        if not isinstance(raw, list):
            raise DatasetError(f"{here}: a session is a list of turns")
        session_id = text_field(ids[number], f"{here} id") if number < len(ids) else f"s{number}"
        if session_id in used:  # each session must be its own thread
            session_id = f"{session_id}#{number}"
        used.add(session_id)
        date = text_field(dates[number], f"{here} date") if number < len(dates) else ""
        turns = []
        for index, turn in enumerate(raw):
            if not isinstance(turn, Mapping):
                raise DatasetError(f"{here}[{index}]: a turn is an object with role and content")
            role = turn.get("role")
            if role not in (USER, ASSISTANT):
                raise DatasetError(f"{here}[{index}]: role must be user or assistant")
            turn_id = f"{session_id}:{index}"
            turns.append(Turn(turn_id, role, text_field(turn.get("content"), f"{here}[{index}]")))
            if turn.get("has_answer") is True:
                evidence.append(turn_id)
        if turns:
            sessions.append(Session(session_id, date, tuple(turns)))
    if not sessions:
        raise DatasetError(f"{where}: the history has no sessions")
    return tuple(sessions), tuple(evidence)
