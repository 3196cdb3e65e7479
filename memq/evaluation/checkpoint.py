"""The checkpoint next to the results: what a run has done, so a resumed run pays for nothing twice.

A journal, one JSON object per line, appended (and flushed) as each step finishes: a session's
extraction, a conversation's facts, a question's answer, its verdict. Appending keeps a run of
25,000 sessions linear (rewriting one growing file after every step would not be); a kill at any
moment can only tear the last line, which is ignored on reading, so at worst that one step is done
again — and a re-done extraction costs nothing (the worker's watermark finds nothing new). The
first line names the run (data set, benchmark, key prefix, conversations); a journal of another
run is refused. The metrics hash as it was when the run began is journalled too, so the extraction
spend of a run resumed three times is still the difference from that start.
"""

from __future__ import annotations

import json
import threading
from pathlib import Path
from typing import IO, Any

from memq.core.errors import MemqError

VERSION = 1


class CheckpointMismatch(MemqError, ValueError):
    """The checkpoint in the results folder belongs to another run (another file or settings)."""


def session_key(conversation_id: str, subject: str, session_id: str) -> str:
    return json.dumps([conversation_id, subject, session_id], ensure_ascii=False)


class Checkpoint:
    def __init__(self, path: Path, identity: dict[str, Any], *, fresh: bool) -> None:
        self.path = path
        self.identity = identity
        self._baseline: dict[str, int] | None = None
        self._estimate: dict[str, Any] | None = None
        self._sessions: dict[str, dict[str, Any]] = {}
        self._conversations: dict[str, list[dict[str, Any]]] = {}
        self._questions: dict[str, dict[str, Any]] = {}
        self._lock = threading.Lock()
        self._file: IO[str] | None = None
        self._fresh = fresh or not path.exists()
        if not self._fresh:
            self._replay()

    @classmethod
    def open(cls, path: Path, identity: dict[str, Any], *, fresh: bool = False) -> Checkpoint:
        """The checkpoint at ``path`` (a new one when there is none, or with ``fresh``); one
        written for another ``identity`` is refused. Nothing is written until a step is."""
        return cls(path, identity, fresh=fresh)

    def _replay(self) -> None:
        try:
            lines = self.path.read_text(encoding="utf-8").splitlines()
        except (OSError, UnicodeDecodeError) as exc:
            raise CheckpointMismatch(f"cannot read the checkpoint {self.path}: {exc}") from exc
        events = []
        for line in lines:
            try:
                events.append(json.loads(line))
            except ValueError:
                continue  # a line torn by a kill: that step is simply done again
        header = events[0] if events else None
        if not isinstance(header, dict) or header.get("identity") != self.identity:
            raise CheckpointMismatch(
                f"{self.path} is the checkpoint of another run (another file, benchmark, key "
                "prefix or selection); pass --fresh to start over or --out for another folder"
            )
        for event in events[1:]:
            if isinstance(event, dict):
                self._apply(event)

    def _apply(self, event: dict[str, Any]) -> None:
        if "baseline" in event and self._baseline is None:
            self._baseline = dict(event["baseline"])
        elif "estimate" in event and self._estimate is None:
            self._estimate = dict(event["estimate"])
        elif "session" in event:
            self._sessions[event["session"]] = {
                "hand_off_ms": event["hand_off_ms"],
                "outcome": event["outcome"],
            }
        elif "conversation" in event:
            self._conversations[event["conversation"]] = list(event["facts"])
        elif "question" in event:
            self._questions.setdefault(event["question"], {}).update(event["fields"])

    def _write(self, event: dict[str, Any]) -> None:
        with self._lock:
            self._apply(event)
            if self._file is None:
                self.path.parent.mkdir(parents=True, exist_ok=True)
                self._file = self.path.open("w" if self._fresh else "a", encoding="utf-8")
                if self._fresh:
                    self._file.write(json.dumps({"version": VERSION, "identity": self.identity}))
                    self._file.write("\n")
                elif not self.path.read_bytes().endswith(b"\n"):
                    self._file.write("\n")  # end the torn line, so the next one stands alone
            # Flushed, not fsynced: the OS keeps written data across a kill of this process.
            self._file.write(json.dumps(event, ensure_ascii=False) + "\n")
            self._file.flush()

    def close(self) -> None:
        with self._lock:
            if self._file is not None:
                self._file.close()
                self._file = None

    @property
    def resumed(self) -> bool:
        return bool(self._sessions or self._questions)

    # --- the metrics hash at the start of the first run
    def metrics_baseline(self) -> dict[str, int] | None:
        return dict(self._baseline) if self._baseline is not None else None

    def set_metrics_baseline(self, raw: dict[str, int]) -> None:
        if self._baseline is None:
            self._write({"baseline": dict(raw)})

    # --- what the first run estimated (a resumed run's estimate covers only the rest)
    def first_estimate(self) -> dict[str, Any] | None:
        return dict(self._estimate) if self._estimate is not None else None

    def set_first_estimate(self, estimate: dict[str, Any]) -> None:
        if self._estimate is None:
            self._write({"estimate": estimate})

    # --- ingestion
    def session_done(self, conversation_id: str, subject: str, session_id: str) -> bool:
        return session_key(conversation_id, subject, session_id) in self._sessions

    def done_sessions(self) -> frozenset[tuple[str, str, str]]:
        found = (json.loads(key) for key in self._sessions)
        return frozenset((str(a), str(b), str(c)) for a, b, c in found)

    def mark_session(
        self,
        conversation_id: str,
        subject: str,
        session_id: str,
        hand_off_ms: list[float],
        outcome: str,
    ) -> None:
        self._write(
            {
                "session": session_key(conversation_id, subject, session_id),
                "hand_off_ms": [round(v, 3) for v in hand_off_ms],
                "outcome": outcome,
            }
        )

    def sessions(self) -> dict[str, dict[str, Any]]:
        return dict(self._sessions)

    def conversation_facts(self, conversation_id: str) -> list[dict[str, Any]] | None:
        facts = self._conversations.get(conversation_id)
        return None if facts is None else list(facts)

    def mark_conversation(self, conversation_id: str, facts: list[dict[str, Any]]) -> None:
        self._write({"conversation": conversation_id, "facts": facts})

    def conversations_done(self) -> frozenset[str]:
        return frozenset(self._conversations)

    # --- questions
    def question(self, question_id: str) -> dict[str, Any]:
        return dict(self._questions.get(question_id, {}))

    def record_question(self, question_id: str, **fields: Any) -> None:
        self._write({"question": question_id, "fields": fields})

    def judged_questions(self) -> frozenset[str]:
        return frozenset(q for q, v in self._questions.items() if "correct" in v)
