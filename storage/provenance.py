"""The provenance rules, pure functions on documents: which messages a new fact is attributed to,
whether it is grounded in what the user said, what learning a fact again records, how a fact is
superseded, and what forgetting a thread leaves of a document.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

from storage.base import Change
from storage.document import Fact, MemoryDocument, SupersededFact, SupersededKind, copy_document
from storage.sources import (
    MAX_EXCERPT_CHARS,
    MAX_SOURCE_EXCERPTS,
    MAX_SOURCE_MESSAGES,
    Role,
    Source,
)
from storage.words import tokenize, words

# "gone": neither current nor superseded, only the history remembers it.
FactStatus = Literal["current", "superseded", "gone"]


@dataclass(frozen=True, slots=True)
class RunMessage:
    """One new message of an extraction run, as the prompt labelled it."""

    label: str
    digest: str
    role: Role
    # The start of the message's text, already made safe to store (see ``Source.excerpts``).
    excerpt: str = ""
    # When it was said (the hand-off time when the agent did not say).
    said_at: datetime | None = None
    # Its whole text as the prompt sent it, read only by :func:`repaired_citation`: never stored
    # (a source keeps ``excerpt``) nor parked (the batch lane reads it back from the context);
    # "" when unknown, and then nothing is repaired to or from this message.
    text: str = field(default="", repr=False)


@dataclass(frozen=True)
class RunInfo:
    """What an extraction run knows about itself, for the sources of the facts it learns."""

    thread_id: str | None
    run_id: str
    at: datetime
    messages: tuple[RunMessage, ...] = ()
    model: str | None = None
    prompt_version: str | None = None
    # The user explicitly confirmed what the assistant said in this run ("yes, that's right").
    user_confirmed: bool = False

    def source_for(self, cites: Sequence[str]) -> Source:
        """The source of a fact citing ``cites``: those messages when every label is one of this
        run's; otherwise (nothing cited, or any label unknown) every new message of the run,
        marked as run-level — a wrong citation is never trusted in part."""
        by_label = {m.label: m for m in self.messages}
        wanted = list(dict.fromkeys(cites))
        exact = bool(wanted) and all(label in by_label for label in wanted)
        chosen = [by_label[label] for label in wanted] if exact else list(self.messages)
        chosen = chosen[-MAX_SOURCE_MESSAGES:]  # a long run names its newest messages
        # Only a citation says which message a fact came from: a run-level source shows none;
        # nor does a run that did not keep its messages' excerpts (all or none, so they align).
        excerpts = [m.excerpt[:MAX_EXCERPT_CHARS] for m in chosen[:MAX_SOURCE_EXCERPTS]]
        if not all(excerpts):
            excerpts = []
        said = [m.said_at for m in chosen if m.said_at is not None]
        return Source(
            thread_id=self.thread_id,
            messages=tuple(m.digest for m in chosen),
            roles=tuple(dict.fromkeys(m.role for m in chosen)),
            attribution="message" if exact else "run",
            excerpts=tuple(excerpts) if exact else (),
            run_id=self.run_id,
            at=self.at,
            model=self.model,
            prompt_version=self.prompt_version,
            said_at=min(said) if said else None,
        )


def grounded(source: Source, *, user_confirmed: bool, require_user: bool) -> bool:
    """Whether a fact with ``source`` may be stored: assistant text alone (which may echo recalled
    memory or third-party content) is not the user's word unless the user confirmed it."""
    if not require_user or user_confirmed or not source.roles:
        return True
    return "user" in source.roles


def repaired_citation(run: RunInfo, content: str, cites: Sequence[str]) -> str | None:
    """The label of the user message a fact is re-attributed to when it cites only assistant
    messages of ``run``; None when it cites something else or cannot be repaired (then the
    grounding rule refuses it as before).

    Small models often cite the reply next to the user's message ("our CI runs on GitLab", then
    "Understood: .gitlab-ci.yml"), which would lose a fact the user did say. The repair holds
    when one user message of the run holds every content word the fact shares with the cited
    text (at least one such word; recall's words, :func:`storage.words.words`, so stop words
    and "user" do not count), the nearest user message before the cited one tried first. A claim
    only the assistant made ("since you are a Neovim power user") shares a word no user message
    says, so it stays refused."""
    by_label = {m.label: (i, m) for i, m in enumerate(run.messages)}
    wanted = list(dict.fromkeys(cites))
    if not wanted or not all(label in by_label for label in wanted):
        return None  # a run-level source: grounded or not, no message to move it from
    cited = [by_label[label] for label in wanted]
    if any(m.role == "user" for _, m in cited):
        return None
    shared = set(tokenize(content)) & {w for _, m in cited for w in words(m.text)}
    if not shared:
        return None
    first = min(i for i, _ in cited)
    # Nearest first, a message before the cited one ahead of one as far after it.
    users = sorted(
        ((i, m) for i, m in enumerate(run.messages) if m.role == "user"),
        key=lambda item: (abs(item[0] - first), item[0] > first),
    )
    return next((m.label for _, m in users if shared <= set(words(m.text))), None)


def add_source(fact: Fact, source: Source, max_sources: int) -> bool:
    """Record that ``fact`` was learnt again from ``source`` (one more confirmation). False, and
    nothing changed, when the source adds nothing: the same run, or messages already among the
    fact's sources (a run extracted again after a crash)."""
    known = fact.provenance()
    for old in known:
        if old.run_id is not None and old.run_id == source.run_id:
            return False
        if old.thread_id == source.thread_id and set(old.messages) & set(source.messages):
            return False
    fact.sources = [*known, source][-max_sources:]
    fact.confirmations += 1
    return True


def merged_sources(facts: Sequence[Fact], max_sources: int) -> list[Source]:
    """The sources of a fact merged from ``facts``: all of theirs, oldest first, bounded."""
    sources = [s for f in facts for s in f.provenance()]
    sources.sort(key=lambda s: s.at.timestamp() if s.at is not None else 0.0)
    return sources[-max_sources:]


def supersede(
    doc: MemoryDocument,
    fact: Fact,
    *,
    kind: SupersededKind,
    reason: str,
    replaced_by: Sequence[str],
    at: datetime,
    thread_id: str | None,
    max_kept: int,
) -> None:
    """Keep ``fact`` (already taken out of ``doc.facts``) as superseded, the oldest entries
    going first once there are ``max_kept``."""
    entry = SupersededFact(
        fact=fact,
        kind=kind,
        superseded_at=at,
        replaced_by=list(replaced_by),
        reason=reason,
        thread_id=thread_id,
    )
    doc.superseded = [*doc.superseded, entry][-max_kept:] if max_kept > 0 else []


@dataclass
class ThreadForgetResult:
    """What forgetting one thread did to one document."""

    removed: list[str] = field(default_factory=list)  # ids of facts learnt only from the thread
    trimmed: int = 0  # facts that keep other sources and lost the thread's
    sections_cleared: list[str] = field(default_factory=list)

    @property
    def changed(self) -> bool:
        return bool(self.removed or self.trimmed or self.sections_cleared)


def _without_thread(fact: Fact, thread_id: str) -> Fact | None:
    """``fact`` without the sources of ``thread_id``; None when they were all it had; the same
    object when it had none of them."""
    known = fact.provenance()
    others = [s for s in known if s.thread_id != thread_id]
    if len(others) == len(known):
        return fact
    if not others:
        return None
    lost = len(known) - len(others)
    thread = fact.source_thread_id
    if thread == thread_id:
        thread = next((s.thread_id for s in others if s.thread_id is not None), None)
    return fact.model_copy(
        update={
            "sources": others,
            "source_thread_id": thread,
            "confirmations": max(0, fact.confirmations - lost),
        }
    )


def forget_thread(
    document: MemoryDocument, thread_id: str, *, section_threads: Mapping[str, str | None]
) -> tuple[MemoryDocument, ThreadForgetResult]:
    """A copy of ``document`` holding nothing learnt only from ``thread_id``: such facts (current
    or superseded) go, other facts lose that thread's sources, and the summary sections whose
    latest rewrite came from it (``section_threads``: section → thread of that rewrite) are
    emptied. Hand-entered facts have no thread and stay."""
    doc = copy_document(document)
    result = ThreadForgetResult()
    kept: list[Fact] = []
    for fact in doc.facts:
        left = _without_thread(fact, thread_id)
        if left is None:
            result.removed.append(fact.id)
            continue
        result.trimmed += left is not fact
        kept.append(left)
    doc.facts = kept
    gone = set(result.removed)
    superseded: list[SupersededFact] = []
    for entry in doc.superseded:
        left = _without_thread(entry.fact, thread_id)
        if left is None:
            result.removed.append(entry.fact.id)
            continue
        update: dict[str, object] = {"fact": left}
        if entry.thread_id == thread_id:
            update["thread_id"] = None
        update["replaced_by"] = [i for i in entry.replaced_by if i not in gone]
        superseded.append(entry.model_copy(update=update))
    doc.superseded = superseded
    for group in (doc.user, doc.history):
        for name in type(group).model_fields:
            if section_threads.get(name) == thread_id and getattr(group, name).summary:
                setattr(group, name, type(getattr(group, name))())
                result.sections_cleared.append(name)
    return doc, result


def section_threads(history: Sequence[Change]) -> dict[str, str | None]:
    """Each section's thread of its latest summary rewrite, from a history oldest first."""
    latest: dict[str, str | None] = {}
    for change in history:
        if change.action == "summary" and change.section:
            latest[change.section] = change.source_thread_id
    return latest


def history_without_thread(
    history: Sequence[Change], thread_id: str, removed_ids: Sequence[str]
) -> list[Change]:
    """The history minus every entry written by a run of ``thread_id`` and every entry about a
    fact that forgetting it removed: both may quote the thread's words."""
    gone = set(removed_ids)
    return [c for c in history if c.source_thread_id != thread_id and (c.fact_id or "") not in gone]


@dataclass(frozen=True)
class FactExplanation:
    """Why memory holds (or held) a fact: its sources, confirmations, what it superseded, what
    superseded it, and every history entry about it or about the facts it replaced."""

    fact_id: str
    status: FactStatus
    fact: Fact | None
    sources: list[Source]
    confirmations: int
    superseded: SupersededFact | None  # this fact's own entry, when it was superseded
    supersedes: list[SupersededFact]  # the facts it replaced
    history: list[Change]  # oldest first

    def to_json(self) -> dict[str, object]:
        return {
            "fact_id": self.fact_id,
            "status": self.status,
            "fact": None if self.fact is None else self.fact.model_dump(mode="json"),
            "sources": [s.model_dump(mode="json") for s in self.sources],
            "confirmations": self.confirmations,
            "superseded": None
            if self.superseded is None
            else self.superseded.model_dump(mode="json", exclude={"fact"}),
            "supersedes": [s.model_dump(mode="json") for s in self.supersedes],
            "history": [c.model_dump(mode="json", exclude_none=True) for c in self.history],
        }


def explain(
    document: MemoryDocument, history: Sequence[Change], fact_id: str
) -> FactExplanation | None:
    """The explanation of ``fact_id`` from a document and its history (oldest first); None when
    neither knows the id."""
    current = document.fact(fact_id)
    own = None if current is not None else document.superseded_fact(fact_id)
    fact = current if current is not None else (own.fact if own is not None else None)
    supersedes = [e for e in document.superseded if fact_id in e.replaced_by]
    related = {fact_id} | {e.fact.id for e in supersedes}
    entries = [c for c in history if c.fact_id in related]
    if fact is None and not entries:
        return None
    status: FactStatus = (
        "current" if current is not None else "superseded" if own is not None else "gone"
    )
    return FactExplanation(
        fact_id=fact_id,
        status=status,
        fact=fact,
        sources=[] if fact is None else fact.provenance(),
        confirmations=0 if fact is None else fact.confirmations,
        superseded=own,
        supersedes=supersedes,
        history=entries,
    )
