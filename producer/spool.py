"""A bounded spool for contexts the producer could not send while Redis was away.

The spool keeps one entry per context id, oldest first, and drops the oldest context when full
(more than ``max_contexts`` contexts, or more than ``max_bytes`` of messages). Two hand-offs of
one context coalesce as the queue would merge them: a flush stays a flush, message lists are
merged (:mod:`producer.accumulate`), so a turn replaced by a summarised one before the replay
keeps the messages the summary dropped.

This class keeps the spool in the process's memory; :class:`producer.spool_disk.DiskSpool` adds
a copy of every entry on disk, so the next process started with the same folder replays what a
process that ended during an outage kept. A request taken out to be sent stays on disk until
:meth:`Spool.sent` says Redis holds it: a crash between the two re-sends it, which the queue's
merge makes harmless (at least once, never lost).
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from pathlib import Path

from producer.enqueue import EnqueueRequest


def request_bytes(request: EnqueueRequest) -> int:
    """What one entry counts against ``max_bytes``: its encoded messages (UTF-8 at most 4 bytes
    a character; the length is an upper bound that costs no encoding)."""
    return len(request.messages_json) + len(request.trace_id or "")


class Spool:
    """Thread-safe; every method is O(1) or O(batch) (plus the disk copy's writes)."""

    folder: Path | None = None  # where the entries are kept on disk; None: in memory only

    def __init__(self, max_contexts: int, max_bytes: int | None = None) -> None:
        self._max = max_contexts
        self._max_bytes = max_bytes
        self._items: OrderedDict[str, EnqueueRequest] = OrderedDict()
        self._bytes = 0
        # Taken out to be sent and not yet confirmed: the disk copy of a newer entry of the same
        # context includes it, so it never holds less than what is not yet in Redis.
        self._inflight: dict[str, EnqueueRequest] = {}
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    @property
    def durable(self) -> bool:
        return self.folder is not None

    def holds(self, context_id: str) -> bool:
        """Whether a context is spooled (or being sent from the spool)."""
        with self._lock:
            return context_id in self._items or context_id in self._inflight

    def put(self, request: EnqueueRequest) -> int:
        """Keep ``request`` as the latest of its context (merged with any spooled one); returns
        how many contexts were dropped to make room (the request itself counts when the spool
        holds nothing)."""
        if self._max == 0:
            return 1
        context_id = request.context_id
        with self._lock:
            older = self._remove(context_id)
            item = request if older is None else older.merged_under(request)
            # What is being sent of the context stays on disk with it until Redis holds it.
            inflight = self._inflight.get(context_id)
            self._add(
                context_id, item, on_disk=None if inflight is None else inflight.merged_under(item)
            )
            return self._shrink()

    def put_back(self, request: EnqueueRequest) -> int:
        """Return a request whose replay failed. A newer request of the same context that was
        spooled meanwhile leads the merge of the two lists; a flush of either survives."""
        if self._max == 0:
            return 1
        context_id = request.context_id
        with self._lock:
            self._inflight.pop(context_id, None)
            newer = self._items.get(context_id)
            if newer is not None:  # merged in place: the newer entry's position is kept
                self._bytes -= request_bytes(newer)
                self._add(context_id, request.merged_under(newer))
                return self._shrink()
            if len(self._items) >= self._max:
                self._forget(context_id)
                return 1  # the spool is full of newer work: this, the oldest, is what goes
            self._add(context_id, request, first=True)
            return self._shrink()

    def take(self, context_id: str) -> EnqueueRequest | None:
        """Remove and return the spooled request of one context (a fresh send supersedes it);
        on disk it stays until :meth:`sent`."""
        if not self._items:
            return None
        with self._lock:
            request = self._remove(context_id)
            if request is not None:
                self._inflight[context_id] = request
            return request

    def pop_batch(self, limit: int) -> list[EnqueueRequest]:
        """Up to ``limit`` requests, oldest first; on disk each stays until :meth:`sent`."""
        with self._lock:
            batch: list[EnqueueRequest] = []
            while self._items and len(batch) < limit:
                context_id, request = self._items.popitem(last=False)
                self._bytes -= request_bytes(request)
                self._inflight[context_id] = request
                batch.append(request)
            return batch

    def sent(self, context_id: str) -> None:
        """Redis holds the context: forget what was taken out of the spool for it (unless newer
        work of it was spooled meanwhile). Cheap when nothing was: a dict lookup."""
        if not self._inflight:
            return
        with self._lock:
            if self._inflight.pop(context_id, None) is not None and context_id not in self._items:
                self._forget(context_id)

    def close(self) -> None:
        """Release what the spool holds outside the process (nothing here)."""

    # --- internals, under the lock
    def _add(
        self,
        context_id: str,
        request: EnqueueRequest,
        *,
        first: bool = False,
        on_disk: EnqueueRequest | None = None,
    ) -> None:
        """At the back (the newest), at the front with ``first`` (a put-back, the oldest), or in
        its place when the context is already there; ``on_disk``: what the disk copy keeps when
        more than ``request`` (what is being sent of it)."""
        self._items[context_id] = request
        if first:
            self._items.move_to_end(context_id, last=False)
        self._bytes += request_bytes(request)
        self._keep(context_id, request if on_disk is None else on_disk, first=first)

    def _remove(self, context_id: str) -> EnqueueRequest | None:
        request = self._items.pop(context_id, None)
        if request is not None:
            self._bytes -= request_bytes(request)
        return request

    def _shrink(self) -> int:
        dropped = 0
        while self._items and (
            len(self._items) > self._max
            or (self._max_bytes is not None and self._bytes > self._max_bytes)
        ):
            context_id, request = self._items.popitem(last=False)
            self._bytes -= request_bytes(request)
            self._inflight.pop(context_id, None)
            self._forget(context_id)
            dropped += 1
        return dropped

    def _keep(self, context_id: str, request: EnqueueRequest, *, first: bool) -> None:
        """The disk copy's hook: ``request`` is now what the spool holds for the context."""

    def _forget(self, context_id: str) -> None:
        """The disk copy's hook: nothing of the context is left to send."""
