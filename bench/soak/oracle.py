"""The soak's verdict: a plain function on plain data, run once the queue has drained.

Every user turn carries a unique marker (``M-`` and 12 hex digits); the scripted model turns each
marker of the new part of a prompt into one fact that also names the model call (``run``), so two
runs that both wrote the same context version leave two facts, where a content dedup would hide
them. The rules:

- every marker of a user who was not forgotten is in that user's memory (of the turn's agent)
  exactly once, or a dead letter of its thread holds it with a reason;
- a marker is never in another user's or agent's memory;
- forgotten users have no document, and no Redis key name or value holds their id or markers;
- every stored document validates against the schema.

With ``appendfsync everysec`` a ``kill -9`` of Redis may drop what Redis acknowledged during the
last second or so: a marker whose last acknowledgement falls in such a window is counted apart
(``lost_in_window``), not as lost.
"""

from __future__ import annotations

import json
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

from pydantic import ValidationError

from storage.document import MemoryDocument

MARKER = re.compile(r"M-[0-9a-f]{12}")

DocKey = tuple[str, str | None]  # (user, agent)


@dataclass(frozen=True)
class Turn:
    """One user turn handed to a producer, as that producer recorded it."""

    marker: str
    user: str
    agent: str | None
    thread: str
    produced_ms: int  # wall clock when the turn was handed over
    acked: bool  # Redis took a hand-over that carried it (else it was only spooled)
    last_ack_ms: int | None = None  # the last acknowledged hand-over that carried it
    spooled: bool = False  # its latest hand-over was spooled (the producer must replay it)
    summarised: bool = False  # the agent's history then dropped it: only a flush carried it last


@dataclass(frozen=True)
class DeadLetter:
    context_id: str
    user: str
    agent: str | None
    reason: str
    markers: frozenset[str]


@dataclass(frozen=True)
class StoredFact:
    content: str
    created_ms: int | None = None


@dataclass(frozen=True)
class LossWindow:
    """Acknowledged writes Redis may have dropped: [start_ms, end_ms] (a kill -9 with everysec)."""

    start_ms: int
    end_ms: int
    what: str = "redis kill -9"


@dataclass(frozen=True)
class OracleInput:
    turns: Sequence[Turn]
    documents: Mapping[DocKey, Sequence[StoredFact]]  # every stored document's facts
    raw_documents: Mapping[DocKey, str]  # each stored document's JSON as it sits in storage
    dead_letters: Sequence[DeadLetter]
    forgotten: frozenset[str]
    redis_dump: Mapping[str, str]  # every key -> its value rendered as text
    loss_windows: Sequence[LossWindow] = ()
    # Celery's broker bookkeeping (kombu's `unacked` hash, the task queue lists): a task message
    # of a worker killed before its ack stays there until the visibility timeout, with the
    # context id (so the user id) in its arguments. No conversation text, so a forgotten user's
    # id there is tolerated; a marker (their text) is not.
    broker_keys: frozenset[str] = frozenset()


@dataclass
class Verdict:
    produced: int = 0
    acknowledged: int = 0
    spooled_only: int = 0  # never acknowledged on a call; left to the producer's spool
    extracted: int = 0
    dead_lettered: int = 0
    forgotten_turns: int = 0
    lost: list[Turn] = field(default_factory=list)
    lost_in_window: list[Turn] = field(default_factory=list)
    duplicated: dict[str, int] = field(default_factory=dict)  # marker -> copies in its memory
    misplaced: list[tuple[str, DocKey]] = field(default_factory=list)  # marker, wrong document
    unknown_markers: list[tuple[str, DocKey]] = field(default_factory=list)
    invalid_documents: list[tuple[DocKey, str]] = field(default_factory=list)
    forgotten_leaks: list[str] = field(default_factory=list)  # where a forgotten user survives
    lag_by_marker: dict[str, int] = field(default_factory=dict)  # hand-over -> fact stored

    @property
    def lags_ms(self) -> list[int]:
        return list(self.lag_by_marker.values())

    @property
    def failures(self) -> list[str]:
        """One line per broken rule (empty: the soak passed)."""
        out = []
        if self.lost:
            out.append(f"{len(self.lost)} lost turn(s), e.g. {_turn_brief(self.lost[0])}")
        if self.duplicated:
            marker, copies = next(iter(self.duplicated.items()))
            out.append(f"{len(self.duplicated)} duplicated marker(s), e.g. {marker} x{copies}")
        if self.misplaced:
            marker, key = self.misplaced[0]
            out.append(
                f"{len(self.misplaced)} marker(s) in the wrong memory, e.g. {marker} in {key}"
            )
        if self.unknown_markers:
            marker, key = self.unknown_markers[0]
            out.append(f"{len(self.unknown_markers)} fact(s) of no turn, e.g. {marker} in {key}")
        if self.invalid_documents:
            key, error = self.invalid_documents[0]
            out.append(f"{len(self.invalid_documents)} invalid document(s), e.g. {key}: {error}")
        if self.forgotten_leaks:
            out.append(
                f"{len(self.forgotten_leaks)} trace(s) of forgotten users, "
                f"e.g. {self.forgotten_leaks[0]}"
            )
        return out

    @property
    def passed(self) -> bool:
        return not self.failures


def _turn_brief(turn: Turn) -> str:
    ack = f"acked at {turn.last_ack_ms}" if turn.acked else "spooled only"
    return f"{turn.marker} user={turn.user} agent={turn.agent} thread={turn.thread} ({ack})"


def in_window(turn: Turn, windows: Iterable[LossWindow]) -> bool:
    """True when every acknowledgement of ``turn`` falls in a window Redis may have lost."""
    if not turn.acked or turn.last_ack_ms is None or turn.spooled:
        return False
    return any(w.start_ms <= turn.last_ack_ms <= w.end_ms for w in windows)


def judge(data: OracleInput) -> Verdict:
    verdict = Verdict()
    turns_by_marker = {turn.marker: turn for turn in data.turns}
    # Where each marker sits, and how many times.
    seen: dict[str, Counter[DocKey]] = {}
    first_stored: dict[str, int] = {}
    for key, facts in data.documents.items():
        for fact in facts:
            for marker in set(MARKER.findall(fact.content)):
                seen.setdefault(marker, Counter())[key] += 1
                if fact.created_ms is not None:
                    first_stored[marker] = min(
                        first_stored.get(marker, fact.created_ms), fact.created_ms
                    )
    dead_markers: dict[DocKey, set[str]] = {}
    for letter in data.dead_letters:
        dead_markers.setdefault((letter.user, letter.agent), set()).update(
            letter.markers if letter.reason else ()
        )

    for turn in data.turns:
        verdict.produced += 1
        if turn.acked:
            verdict.acknowledged += 1
        else:
            verdict.spooled_only += 1
        if turn.user in data.forgotten:
            verdict.forgotten_turns += 1
            continue
        home: DocKey = (turn.user, turn.agent)
        places = seen.get(turn.marker, Counter())
        copies = places.get(home, 0)
        if copies >= 1:
            verdict.extracted += 1
            if turn.marker in first_stored:
                lag = max(0, first_stored[turn.marker] - turn.produced_ms)
                verdict.lag_by_marker[turn.marker] = lag
        if copies > 1:
            verdict.duplicated[turn.marker] = copies
        if copies == 0:
            if turn.marker in dead_markers.get(home, set()):
                verdict.dead_lettered += 1
            elif in_window(turn, data.loss_windows):
                verdict.lost_in_window.append(turn)
            else:
                verdict.lost.append(turn)
        verdict.misplaced.extend((turn.marker, key) for key in places if key != home)

    for marker, places in seen.items():
        if marker not in turns_by_marker:
            verdict.unknown_markers.extend((marker, key) for key in places)

    for key, raw in data.raw_documents.items():
        problem = schema_problem(raw)
        if problem:
            verdict.invalid_documents.append((key, problem))

    verdict.forgotten_leaks = forgotten_traces(data)
    return verdict


def schema_problem(raw: str) -> str | None:
    """Why stored text is not a schema-valid document, or None. The model repairs sloppy values
    on load (DeerFlow's files), so "valid" here is stricter: the text must validate *and* be what
    the schema writes back, i.e. nothing had to be repaired."""
    try:
        stored = json.loads(raw)
    except ValueError as exc:
        return f"not JSON: {exc}"
    if not isinstance(stored, dict):
        return f"the top level is a {type(stored).__name__}"
    try:
        document = MemoryDocument.model_validate(stored)
    except ValidationError as exc:
        return str(exc).splitlines()[0][:200]
    canonical = json.loads(document.model_dump_json())
    if canonical != stored:
        fields = sorted(
            name for name in set(canonical) | set(stored) if canonical.get(name) != stored.get(name)
        )
        return f"needed repair on load: {', '.join(fields)}"
    return None


def forgotten_traces(data: OracleInput) -> list[str]:
    """Documents, key names or values that still hold a forgotten user's id or markers."""
    if not data.forgotten:
        return []
    owner = {turn.marker: turn.user for turn in data.turns if turn.user in data.forgotten}
    user_ids = re.compile("|".join(re.escape(user) for user in sorted(data.forgotten)))
    leaks = [f"document {key}" for key in data.documents if key[0] in data.forgotten]
    for key, value in data.redis_dump.items():
        broker = key in data.broker_keys or key.startswith("_kombu.")
        for where, text in (("key name", key), ("value", value)):
            found = None if broker else user_ids.search(text)
            if found:
                leaks.append(f"{where} of {key!r:.120} holds forgotten user {found.group(0)}")
                break
            markers = [m for m in MARKER.findall(text) if m in owner]
            if markers:
                leaks.append(f"{where} of {key!r:.120} holds {markers[0]} of {owner[markers[0]]}")
                break
    return leaks


def percentile(samples: Sequence[int], pct: float) -> int | None:
    """Nearest-rank percentile (None for no samples)."""
    if not samples:
        return None
    ordered = sorted(samples)
    rank = max(0, min(len(ordered) - 1, -(-len(ordered) * pct // 100) - 1))
    return ordered[int(rank)]
