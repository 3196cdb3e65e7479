"""The checkpoint next to the results: what a run has done, so a resumed run pays for nothing twice.

One JSON file, rewritten whole (to a temporary file, then renamed over the old one: a kill at any
moment leaves either the old or the new checkpoint, never half of one) after every session
extracted and every question answered or judged. It records per (conversation, subject, session)
that the extraction finished, per conversation the facts kept at its end, per question the answer
and the verdict with their token usage, and the metrics hash as it was when the run began, so the
extraction spend of a run that was resumed three times is still the difference from that start.
"""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path
from typing import Any

from memq.core.errors import MemqError

VERSION = 1


class CheckpointMismatch(MemqError, ValueError):
    """The checkpoint in the results folder belongs to another run (another file or settings)."""


def session_key(conversation_id: str, subject: str, session_id: str) -> str:
    return json.dumps([conversation_id, subject, session_id], ensure_ascii=False)


class Checkpoint:
    def __init__(self, path: Path, identity: dict[str, Any], state: dict[str, Any]) -> None:
        self.path = path
        self.identity = identity
        self._state = state
        self._lock = threading.Lock()

    @classmethod
    def open(cls, path: Path, identity: dict[str, Any], *, fresh: bool = False) -> Checkpoint:
        """The checkpoint at ``path`` (a new one when there is none, or with ``fresh``); one
        written for another ``identity`` (data set, benchmark, key prefix) is refused."""
        if path.exists() and not fresh:
            try:
                state = json.loads(path.read_text(encoding="utf-8"))
            except (OSError, ValueError) as exc:
                raise CheckpointMismatch(f"cannot read the checkpoint {path}: {exc}") from exc
            if not isinstance(state, dict) or state.get("identity") != identity:
                raise CheckpointMismatch(
                    f"{path} is the checkpoint of another run (another file, benchmark or key "
                    "prefix); pass --fresh to start over or --out for another folder"
                )
            return cls(path, identity, state)
        state = {
            "version": VERSION,
            "identity": identity,
            "metrics_baseline": None,
            "sessions": {},
            "conversations": {},
            "questions": {},
        }
        return cls(path, identity, state)

    @property
    def resumed(self) -> bool:
        return bool(self._state["sessions"] or self._state["questions"])

    # --- the metrics hash at the start of the first run
    def metrics_baseline(self) -> dict[str, int] | None:
        baseline = self._state["metrics_baseline"]
        return dict(baseline) if baseline is not None else None

    def set_metrics_baseline(self, raw: dict[str, int]) -> None:
        with self._lock:
            if self._state["metrics_baseline"] is None:
                self._state["metrics_baseline"] = dict(raw)
                self._save()

    # --- ingestion
    def session_done(self, conversation_id: str, subject: str, session_id: str) -> bool:
        return session_key(conversation_id, subject, session_id) in self._state["sessions"]

    def done_sessions(self) -> frozenset[tuple[str, str, str]]:
        found = (json.loads(key) for key in self._state["sessions"])
        return frozenset((str(a), str(b), str(c)) for a, b, c in found)

    def mark_session(
        self,
        conversation_id: str,
        subject: str,
        session_id: str,
        hand_off_ms: list[float],
        outcome: str,
    ) -> None:
        with self._lock:
            self._state["sessions"][session_key(conversation_id, subject, session_id)] = {
                "hand_off_ms": [round(v, 3) for v in hand_off_ms],
                "outcome": outcome,
            }
            self._save()

    def sessions(self) -> dict[str, dict[str, Any]]:
        return dict(self._state["sessions"])

    def conversation_facts(self, conversation_id: str) -> list[dict[str, Any]] | None:
        entry = self._state["conversations"].get(conversation_id)
        return None if entry is None else list(entry["facts"])

    def mark_conversation(self, conversation_id: str, facts: list[dict[str, Any]]) -> None:
        with self._lock:
            self._state["conversations"][conversation_id] = {"facts": facts}
            self._save()

    def conversations_done(self) -> frozenset[str]:
        return frozenset(self._state["conversations"])

    # --- questions
    def question(self, question_id: str) -> dict[str, Any]:
        return dict(self._state["questions"].get(question_id, {}))

    def record_question(self, question_id: str, **fields: Any) -> None:
        with self._lock:
            self._state["questions"].setdefault(question_id, {}).update(fields)
            self._save()

    def judged_questions(self) -> frozenset[str]:
        return frozenset(q for q, v in self._state["questions"].items() if "correct" in v)

    def _save(self) -> None:
        self.path.parent.mkdir(parents=True, exist_ok=True)
        temporary = self.path.with_name(self.path.name + ".tmp")
        with temporary.open("w", encoding="utf-8") as handle:
            json.dump(self._state, handle, ensure_ascii=False)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, self.path)
