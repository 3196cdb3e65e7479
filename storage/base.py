"""The storage plug point: a protocol every backend implements, and the change record it keeps."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Literal, Protocol, runtime_checkable

from pydantic import BaseModel, Field

from storage.document import Fact, MemoryDocument, utc_now

ChangeAction = Literal[
    "add",
    "remove",
    "merge",
    "stale",
    "edit",
    "summary",
    "import",
    "clear",
    "evict",
    "supersede",
    "confirm",
    "forget",
    "restore",
    "block",
    "unblock",
]
# A value a change replaced: a fact's content, category or confidence, a summary's text.
FieldValue = str | float | None


class FieldChange(BaseModel):
    """One field a change altered, from ``old`` to ``new``."""

    field: str
    old: FieldValue = None
    new: FieldValue = None


class Change(BaseModel):
    """One entry of a document's history: what changed, when, why, and from which thread."""

    at: datetime = Field(default_factory=utc_now)
    action: ChangeAction
    fact_id: str | None = None
    content: str | None = None
    reason: str = ""
    source_thread_id: str | None = None
    section: str | None = None
    # A change by hand: exactly the fields it altered, and who made it (the API key's name).
    changed: list[FieldChange] | None = None
    by: str | None = None
    # A fact removed by hand, as it was (its sources, category, confidence): what a restore puts
    # back. The history is bounded, so this is kept no longer than the entry itself.
    fact: Fact | None = None


@dataclass(frozen=True)
class UpdateResult:
    """What an ``update`` callback returns when it also wants its changes kept in the history."""

    document: MemoryDocument
    changes: list[Change] = field(default_factory=list)


UpdateFn = Callable[[MemoryDocument], "MemoryDocument | UpdateResult"]
# (document, whole history oldest first) → (new document, new whole history), or None: no change.
RewriteFn = Callable[[MemoryDocument, list["Change"]], "tuple[MemoryDocument, list[Change]] | None"]


@dataclass(frozen=True, slots=True)
class Fence:
    """The claim an extraction runs under. A fenced save succeeds only while this claim is the
    current one of its context, checked in the same atomic step as the write; the token is the
    queue's claim counter, so a newer claim always has a larger ``epoch``."""

    context_id: str
    token: str
    # The context's new extraction watermark, stored in the same atomic step as the document
    # where the storage can (Redis): a worker killed between its save and its settlement then
    # leaves nothing for the next run to extract again.
    watermark: str | None = None

    @property
    def epoch(self) -> int:
        return int(self.token) if self.token.isdigit() else 0


@runtime_checkable
class SharedReads(Protocol):
    """A backend that can hand out the document it keeps parsed, without copying it: for a
    reader that only looks (the injector renders the block from it on every agent turn, and a
    private copy of 300 facts cost a third of that). The caller must not change what it gets:
    the next reader of the unchanged document gets the same object."""

    def view(self, user_id: str, agent_name: str | None = None) -> MemoryDocument: ...


class PendingRead(Protocol):
    """A read of one memory document that may ride in another caller's pipeline on the same
    Redis (the worker's first round trip of a run): ``queue`` puts it on the pipeline (False:
    it cannot go there, nothing queued), ``take`` gets its reply, ``document`` gives what
    ``load`` would have — read here when it was not queued."""

    user_id: str
    agent_name: str | None

    def queue(self, pipe: Any) -> bool: ...

    def take(self, reply: Any) -> None: ...

    def document(self) -> MemoryDocument: ...


@runtime_checkable
class PipelinedReads(Protocol):
    """A backend whose reads can be sent in another caller's pipeline (:class:`PendingRead`)."""

    def pending_read(self, user_id: str, agent_name: str | None) -> PendingRead: ...


@runtime_checkable
class MemoryStorage(Protocol):
    """Where the memory document of each (user, agent) lives.

    ``agent_name=None`` is the user-global memory. ``update`` is an atomic read-modify-write: the
    callback gets the *latest* document (never a shared object) and may be called again on a
    conflict, so it must be a pure function of its argument.
    """

    def load(self, user_id: str, agent_name: str | None = None) -> MemoryDocument: ...

    def save(
        self,
        user_id: str,
        agent_name: str | None,
        document: MemoryDocument,
        *,
        changes: list[Change] | None = None,
    ) -> None: ...

    def update(
        self, user_id: str, agent_name: str | None, fn: UpdateFn, *, fence: Fence | None = None
    ) -> MemoryDocument:
        """With ``fence``, raises :class:`memq.core.errors.StaleClaim` (nothing written) unless the
        fence's claim is still current when the document is written."""
        ...

    def fence_run(self, user_id: str, agent_name: str | None, fence: Fence) -> None:
        """Record, before a run reads its snapshot, that ``fence`` now extracts into this document:
        a save of an older claim of the same context is refused from here on. Raises StaleClaim if
        a newer claim already did. Backends whose save checks the queue atomically do nothing."""
        ...

    def history(
        self, user_id: str, agent_name: str | None = None, *, limit: int = 100
    ) -> list[Change]: ...

    def rewrite(self, user_id: str, agent_name: str | None, fn: RewriteFn) -> bool:
        """Replace a stored document *and its whole history* in one atomic step (forgetting a
        thread rewrites both). ``fn`` gets the latest of both and may run again on a conflict;
        True when something was written (False: nothing stored, or ``fn`` returned None)."""
        ...

    def list_agents(self, user_id: str) -> list[str | None]:
        """Every agent of that user with a stored document (None = the user-global memory)."""
        ...

    def list_users(self) -> list[str]: ...

    def delete(self, user_id: str, agent_name: str | None) -> bool:
        """Remove the document and its history; True when something was there."""
        ...
