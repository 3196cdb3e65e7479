"""A bounded, in-process spool for contexts the producer could not send while Redis was away.

The spool keeps one entry per context id, oldest first, and drops the oldest context when full. Two
hand-offs of one context coalesce as the queue would merge them: a flush stays a flush, message
lists are merged (:mod:`producer.accumulate`), so a turn replaced by a summarised one before the
replay keeps the messages the summary dropped. It lives in the agent's memory, so a process that
dies during an outage loses it.
"""

from __future__ import annotations

import threading
from collections import OrderedDict

from producer.enqueue import EnqueueRequest


class Spool:
    """Thread-safe; every method is O(1) or O(batch)."""

    def __init__(self, max_contexts: int) -> None:
        self._max = max_contexts
        self._items: OrderedDict[str, EnqueueRequest] = OrderedDict()
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._items)

    def put(self, request: EnqueueRequest) -> int:
        """Keep ``request`` as the latest of its context (merged with any spooled one); returns
        how many contexts were dropped to make room (the request itself counts when the spool
        holds nothing)."""
        if self._max == 0:
            return 1
        context_id = request.context_id
        with self._lock:
            older = self._items.pop(context_id, None)
            self._items[context_id] = request if older is None else older.merged_under(request)
            dropped = 0
            while len(self._items) > self._max:
                self._items.popitem(last=False)
                dropped += 1
            return dropped

    def put_back(self, request: EnqueueRequest) -> int:
        """Return a request whose replay failed. A newer request of the same context that was
        spooled meanwhile leads the merge of the two lists; a flush of either survives."""
        if self._max == 0:
            return 1
        context_id = request.context_id
        with self._lock:
            newer = self._items.get(context_id)
            if newer is not None:
                self._items[context_id] = request.merged_under(newer)
                return 0
            if len(self._items) >= self._max:
                return 1  # the spool is full of newer work: this, the oldest, is what goes
            self._items[context_id] = request
            self._items.move_to_end(context_id, last=False)
            return 0

    def take(self, context_id: str) -> EnqueueRequest | None:
        """Remove and return the spooled request of one context (a fresh send supersedes it)."""
        if not self._items:
            return None
        with self._lock:
            return self._items.pop(context_id, None)

    def pop_batch(self, limit: int) -> list[EnqueueRequest]:
        """Up to ``limit`` requests, oldest first."""
        with self._lock:
            count = min(limit, len(self._items))
            return [self._items.popitem(last=False)[1] for _ in range(count)]
