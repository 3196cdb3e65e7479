"""The enqueue operation: what one producer call sends, the deadline maths, and the Lua call.

One enqueue is one EVALSHA of ``enqueue.lua`` (one round trip). :func:`compute_deadline`,
:func:`replaces_messages` and :mod:`producer.accumulate` mirror the script's scheduling and merge
rules in Python so they can be unit-tested and documented in one place; the script stays the
authority.

A context accumulates the messages it is handed until a worker extracts them: an enqueue merges
its list into the stored one rather than replacing it, so a summarised or truncated history never
drops what was handed over and not yet extracted. Every request carries its capture time (when the
agent handed the messages over). A request can reach Redis after a newer one of the same context —
a spool replay racing the agent's next turn, or a replica replaying what it spooled during an
outage only it saw — and then only adds what the newer list lacks; its trace id does not replace
the newer one's, and it still bumps the version (and a flush still makes the context due now).
"""

from __future__ import annotations

import enum
import logging
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from redis.exceptions import NoScriptError

from memq.core.connection import BUSY, REDIS_ERRORS, RedisClient, held_connection, unavailable
from memq.core.errors import InvalidIdentifier
from memq.core.identity import ContextKey
from memq.core.keys import KeySchema
from memq.core.scripts import register
from producer.accumulate import merge_within
from producer.bounds import hand_off_json
from producer.messages import TimeTally, memory_rows, rows_have_dialogue

log = logging.getLogger(__name__)

MAX_TRACE_ID_LENGTH = 256
_ROUTES_KEPT = 4096  # contexts whose keys an Enqueuer keeps formatted


class EnqueueCode(enum.IntEnum):
    """The script's return codes."""

    SCHEDULED = 1
    DEFERRED_IN_FLIGHT = 2


_CODES = {code.value: code for code in EnqueueCode}


@dataclass(frozen=True, slots=True)
class EnqueueRequest:
    """Everything one enqueue sends, already filtered and encoded (also what the spool keeps).

    ``captured_ms`` is when the agent handed the messages over (epoch ms); ``None`` means "now"
    at send time, which is only right for a request sent at once, never for one spooled.
    ``failures`` counts the sends that failed for a reason other than Redis (the producer drops a
    request that keeps failing)."""

    key: ContextKey
    messages_json: str
    flush: bool = False
    trace_id: str | None = None
    captured_ms: int | None = None
    failures: int = 0
    # The hard cap of a context's messages (context_max_bytes), so that merging spooled
    # hand-offs stays within what the script would store.
    max_bytes: int | None = None
    # Message times that could not be read (the worker takes the hand-off time for them).
    times_dropped: int = 0

    @property
    def context_id(self) -> str:
        return self.key.id

    def merged_under(self, newer: EnqueueRequest) -> EnqueueRequest:
        """``newer`` with both message lists merged (and a flush of either kept), as the
        script merges them: the list captured later (``newer``'s on a tie) is the agent's view,
        the other adds what it lacks; trace id and capture time are the later one's."""
        latest, earlier = newer, self
        if self.captured_ms is not None and not replaces_messages(
            newer.captured_ms if newer.captured_ms is not None else self.captured_ms,
            self.captured_ms,
        ):
            latest, earlier = self, newer
        limit = newer.max_bytes if newer.max_bytes is not None else self.max_bytes
        merged, cut = merge_within(earlier.messages_json, latest.messages_json, limit)
        if cut:
            log.warning(
                "memq: %s: %d spooled messages cut to stay within %d bytes",
                newer.key.describe(),
                cut,
                limit,
            )
        return EnqueueRequest(
            key=newer.key,
            messages_json=merged,
            flush=self.flush or newer.flush,
            trace_id=latest.trace_id,
            captured_ms=latest.captured_ms,
            failures=max(self.failures, newer.failures),
            max_bytes=limit,
        )


@dataclass(frozen=True, slots=True)
class EnqueueResult:
    context_id: str
    version: int
    deadline_ms: int
    code: EnqueueCode
    cut: int = 0  # oldest messages the script cut to stay within context_max_bytes


def build_request(
    key: ContextKey,
    raw_messages: Iterable[object],
    *,
    flush: bool = False,
    trace_id: str | None = None,
    max_chars: int = 200_000,
    max_messages: int = 1000,
    captured_ms: int | None = None,
    max_bytes: int | None = None,
) -> EnqueueRequest | None:
    """Filter, check the minimum dialogue and encode within the caps (:mod:`producer.bounds`:
    ``max_chars`` of JSON, ``max_messages``); ``None`` when nothing is worth sending.
    Raises :class:`InvalidMessages` on shapes it does not understand."""
    if trace_id is not None and (
        not isinstance(trace_id, str) or len(trace_id) > MAX_TRACE_ID_LENGTH
    ):
        raise InvalidIdentifier(f"trace_id must be a string of at most {MAX_TRACE_ID_LENGTH} chars")
    if trace_id is not None and not trace_id.isascii():
        # A lone surrogate cannot be sent as UTF-8: replaced, as in the messages, so the request
        # can always be encoded.
        trace_id = trace_id.encode("utf-8", "replace").decode("utf-8")
    tally = TimeTally()
    rows = memory_rows(raw_messages, max_chars=max_chars, tally=tally)
    if not rows_have_dialogue(rows):
        return None
    return EnqueueRequest(
        key=key,
        messages_json=hand_off_json(rows, max_chars, max_messages),
        flush=flush,
        trace_id=trace_id,
        captured_ms=captured_ms,
        max_bytes=max_bytes,
        times_dropped=tally.dropped,
    )


def replaces_messages(captured_ms: int, stored_captured_ms: int | None) -> bool:
    """Whether an enqueue captured at ``captured_ms`` is the agent's current view (its list leads
    the merge, its trace id replaces the stored one): only when the stored messages were not
    captured later; a tie is a re-send of the same turn."""
    return stored_captured_ms is None or captured_ms >= stored_captured_ms


def compute_deadline(
    now_ms: int,
    *,
    debounce_ms: int,
    max_delay_ms: int,
    flush: bool,
    pending_since_ms: int | None = None,
    stored_deadline_ms: int | None = None,
) -> int:
    """When the context becomes due: now for a flush, else ``debounce_ms`` after this enqueue but
    never later than ``max_delay_ms`` after the first enqueue since the last claim; a deadline that
    has already passed is kept, so a flush is never postponed by a later normal enqueue."""
    pending = now_ms if pending_since_ms is None else pending_since_ms
    deadline = now_ms if flush else min(now_ms + debounce_ms, pending + max_delay_ms)
    if stored_deadline_ms is not None and stored_deadline_ms <= now_ms:
        return stored_deadline_ms
    return deadline


class Enqueuer:
    """The registered ``enqueue.lua`` of one client, with the timing it applies."""

    def __init__(
        self,
        client: RedisClient,
        keys: KeySchema,
        *,
        debounce_ms: int,
        max_delay_ms: int,
        retention_ms: int = 30 * 86_400_000,
        pending_max_bytes: int | None = None,
        context_max_bytes: int | None = None,
        hold_connection: bool = False,
    ):
        self._script = register(client, "producer", "enqueue")
        self._keys = keys
        self._debounce = str(debounce_ms)
        self._max_delay = str(max_delay_ms)
        self._retention = str(retention_ms)
        self._pending_max = "" if pending_max_bytes is None else str(pending_max_bytes)
        self._context_max = "" if context_max_bytes is None else str(context_max_bytes)
        self._client = client
        # With ``hold_connection`` (a client of the caller's own: its pool is not shared), one
        # connection held for the calls (None where the client must route or retry): a call per
        # agent turn skips the pool and redis-py's dispatch.
        self._held = held_connection(client) if hold_connection else None
        # Per context: its five keys and its identifying arguments, formatted once. An agent
        # hands the same thread over on every turn; bounded, so it never grows with traffic.
        self._routes: dict[str, tuple[str, ...]] = {}

    def close(self) -> None:
        """Give the held connection back to the client's pool."""
        if self._held is not None:
            self._held.close()

    def _evalsha(self, keys: tuple[str, ...], args: tuple[str | int, ...]) -> Any:
        """The script's reply: on the held connection, else (none, or another thread on it)
        through the client. A Redis that lost the script (restarted, flushed) gets it loaded on
        the connection that was told so, and the call is made again."""
        sha = self._script.sha
        held = self._held
        if held is not None:
            command = ("EVALSHA", sha, len(keys), *keys, *args)  # one flat tuple, packed as is
            try:
                reply = held.execute(command)
            except NoScriptError:
                load = ("SCRIPT", "LOAD", str(self._script.script))
                reply = BUSY if held.execute(load) is BUSY else held.execute(command)
            if reply is not BUSY:
                return reply
        try:
            return self._client.evalsha(sha, len(keys), *keys, *args)
        except NoScriptError:  # the wrapper loads it and calls again
            return self._script(keys=keys, args=args)

    def _route(self, key: ContextKey) -> tuple[str, ...]:
        # By the id, a string: its hash is kept, a ContextKey's is computed on every lookup.
        route = self._routes.get(key.id)
        if route is None:
            context_id = key.id
            q = self._keys.for_context(context_id)
            route = (
                q.context(context_id),
                q.due,
                q.inflight,
                q.dead,
                q.user_contexts(key.user_id),
                key.thread_id,
                key.user_id,
                key.agent_name or "",
                context_id,
            )
            if len(self._routes) >= _ROUTES_KEPT:
                self._routes.clear()
            self._routes[context_id] = route
        return route

    def __call__(self, request: EnqueueRequest, now_ms: int) -> EnqueueResult:
        """One round trip. Raises :class:`RedisUnavailable` when Redis does not take it."""
        key = request.key
        ctx, due, inflight, dead, users, thread_id, user_id, agent, context_id = self._route(key)
        keys = (ctx, due, inflight, dead, users)
        # The script's ARGV (its header).
        args = (
            now_ms,
            self._debounce,
            self._max_delay,
            "1" if request.flush else "0",
            request.messages_json,
            thread_id,
            user_id,
            agent,
            request.trace_id or "",
            context_id,
            now_ms if request.captured_ms is None else request.captured_ms,
            self._retention,
            self._pending_max,
            self._context_max,
        )
        try:
            reply = self._evalsha(keys, args)
        except REDIS_ERRORS as exc:
            # Connection loss, timeout, but also OOM or READONLY: either way the context did not
            # get in, and the caller (the fail-open producer) spools it.
            raise unavailable(exc, "the conversation was not enqueued") from exc
        version, deadline_ms, code, cut = reply
        if int(cut):  # the worker reports the context's total at its next run
            log.info(
                "memq: %s: %d oldest messages cut to stay within context_max_bytes",
                key.describe(),
                int(cut),
            )
        # A dictionary hit, not the Enum's call (Python-level, a sizeable share of this call).
        reply_code = _CODES.get(int(code)) or EnqueueCode(int(code))
        return EnqueueResult(context_id, int(version), int(deadline_ms), reply_code, int(cut))
