"""Memory documents in Redis, for replicas and workers on different hosts (``MEMQ_STORAGE=redis``).

Each (user, agent) is a hash ``{doc, rev}`` beside a history list, both under one hash tag. An
update is optimistic: read the document and its revision, apply the callback, and write back with a
Lua compare-and-set that also appends the history; on a conflict the callback runs again on the
newer document. So concurrent updates from any number of workers all survive, and nobody holds a
lock across a slow callback.
"""

from __future__ import annotations

import contextlib
import logging
import random
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from typing import Any

import redis
from redis.exceptions import NoScriptError

from memq.core.connection import (
    REDIS_ERRORS,
    UNREACHABLE_ERRORS,
    RedisClient,
    redis_client,
    unavailable,
)
from memq.core.errors import (
    CorruptMemoryFile,
    InvalidIdentifier,
    LockTimeout,
    StaleClaim,
    StorageError,
)
from memq.core.identity import validate_agent_name, validate_user_id
from memq.core.keys import KeySchema
from memq.core.scripts import LuaScripts
from memq.core.settings import MemqSettings
from storage.base import Change, Fence, RewriteFn, UpdateFn
from storage.document import MemoryDocument, copy_document, empty_document
from storage.history import (
    DocumentDecodeError,
    bounded,
    decode_changes,
    dump_document,
    encode_change,
    newest_first,
    parse_document,
    split_update_result,
    stamp_for_save,
)

log = logging.getLogger(__name__)

UNCONDITIONAL = -1


@contextlib.contextmanager
def _redis_errors(what: str) -> Iterator[None]:
    try:
        yield
    except UNREACHABLE_ERRORS as exc:
        raise unavailable(exc, what) from exc
    except REDIS_ERRORS as exc:
        raise StorageError(f"{what}: {exc}") from exc


class RedisMemoryStorage:
    """:class:`storage.base.MemoryStorage` in Redis."""

    def __init__(self, settings: MemqSettings, redis_client_: RedisClient | None = None) -> None:
        self._owns_client = redis_client_ is None
        self.redis = redis_client_ if redis_client_ is not None else redis_client(settings)
        self.keys = KeySchema(settings.key_prefix, settings.shards)
        self.conflict_timeout_seconds = settings.storage_lock_timeout_seconds
        self.history_max_entries = settings.history_max_entries
        self.watermark_ttl_ms = settings.watermark_ttl_ms
        scripts = LuaScripts(self.redis, "storage", ("save_document", "rewrite_document"))
        # The parsed document of each key beside the text it was parsed from (an LRU bounded as
        # the file store's): every read still fetches the text, and a text equal to the one kept
        # is not parsed again. Parsing 300 facts with their sources was ~80 % of a recall.
        self._parsed: OrderedDict[str, tuple[str, MemoryDocument]] = OrderedDict()
        self._parsed_max = settings.storage_cache_max_documents
        self._parsed_lock = threading.Lock()
        self._save_script = scripts["save_document"]
        self._rewrite_script = scripts["rewrite_document"]

    def close(self) -> None:
        if self._owns_client:
            self.redis.close()

    # --- the protocol
    def load(self, user_id: str | None, agent_name: str | None = None) -> MemoryDocument:
        user, agent = validate_user_id(user_id), validate_agent_name(agent_name)
        return self._fetch(user, agent)[1]

    def view(self, user_id: str | None, agent_name: str | None = None) -> MemoryDocument:
        """:meth:`load` without the private copy: never change what it returns
        (:class:`storage.base.SharedReads`)."""
        user, agent = validate_user_id(user_id), validate_agent_name(agent_name)
        return self._fetch(user, agent, copy=False)[1]

    def save(
        self,
        user_id: str | None,
        agent_name: str | None,
        document: MemoryDocument,
        *,
        changes: list[Change] | None = None,
    ) -> None:
        user, agent = validate_user_id(user_id), validate_agent_name(agent_name)
        self._store(user, agent, UNCONDITIONAL, stamp_for_save(document), changes or [])

    def fence_run(self, user_id: str | None, agent_name: str | None, fence: Fence) -> None:
        """Nothing to record: the save script checks the context's claim token itself."""

    def update(
        self,
        user_id: str | None,
        agent_name: str | None,
        fn: UpdateFn,
        *,
        fence: Fence | None = None,
    ) -> MemoryDocument:
        user, agent = validate_user_id(user_id), validate_agent_name(agent_name)
        deadline = time.monotonic() + self.conflict_timeout_seconds
        attempt = 0
        while True:
            revision, current = self._fetch(user, agent)
            before = copy_document(current)  # the callback may change its argument in place
            document, changes = split_update_result(fn(current))
            if document == before and not changes:
                return document
            saved = stamp_for_save(document)
            if self._store(user, agent, revision, saved, changes, fence):
                return saved
            if time.monotonic() >= deadline:
                raise LockTimeout(
                    f"memory of user={user} agent={agent or '-'} kept changing under "
                    f"{attempt + 1} attempts for {self.conflict_timeout_seconds:g} s"
                )
            attempt += 1
            # Jittered backoff: several workers that conflicted do not retry in lockstep.
            time.sleep(random.uniform(0, min(0.05, 0.001 * 2**attempt)))

    def history(
        self, user_id: str | None, agent_name: str | None = None, *, limit: int = 100
    ) -> list[Change]:
        user, agent = validate_user_id(user_id), validate_agent_name(agent_name)
        if limit <= 0:
            return []
        with _redis_errors("reading memory history"):
            raw = self.redis.lrange(self.keys.memory_history(user, agent), -limit, -1)
        return newest_first(decode_changes(str(item) for item in raw), limit)

    def rewrite(self, user_id: str | None, agent_name: str | None, fn: RewriteFn) -> bool:
        user, agent = validate_user_id(user_id), validate_agent_name(agent_name)
        keys = [self.keys.memory_document(user, agent), self.keys.memory_history(user, agent)]
        deadline = time.monotonic() + self.conflict_timeout_seconds
        while True:
            with _redis_errors("reading a memory document and its history"):
                # One transaction: the history read belongs to the revision read with it.
                pipe = self.redis.pipeline(transaction=True)
                pipe.hget(keys[0], "rev")
                pipe.lrange(keys[1], 0, -1)
                rev, raw = pipe.execute()
            revision, current = self._fetch(user, agent)
            if revision == int(rev or 0):
                if not self.redis.exists(keys[0]):
                    return False
                result = fn(current, decode_changes(str(item) for item in raw))
                if result is None:
                    return False
                document, history = result
                entries = [encode_change(c) for c in bounded(history, self.history_max_entries)]
                with _redis_errors("rewriting a memory document"):
                    code, _ = self._rewrite_script(
                        keys=keys,
                        args=[revision, dump_document(stamp_for_save(document)), *entries],
                    )
                if int(code) == 1:
                    return True
            if time.monotonic() >= deadline:
                raise LockTimeout(f"memory of user={user} agent={agent or '-'} kept changing")
            time.sleep(random.uniform(0, 0.01))  # saved in between: read both again

    def list_users(self) -> list[str]:
        return sorted({user for user, _ in self._indexed()})

    def list_agents(self, user_id: str | None) -> list[str | None]:
        user = validate_user_id(user_id)
        agents = [agent for owner, agent in self._indexed() if owner == user]
        return sorted(agents, key=lambda a: (a is not None, a or ""))

    def delete(self, user_id: str | None, agent_name: str | None) -> bool:
        user, agent = validate_user_id(user_id), validate_agent_name(agent_name)
        with _redis_errors("deleting a memory document"):
            removed = self.redis.delete(
                self.keys.memory_document(user, agent), self.keys.memory_history(user, agent)
            )
            self._forget_parsed(self.keys.memory_document(user, agent))
            self.redis.srem(self.keys.memory_index(), self.keys.index_member(user, agent))
        return bool(removed)

    # --- internals
    def _fetch(
        self, user: str, agent: str | None, *, copy: bool = True
    ) -> tuple[int, MemoryDocument]:
        key = self.keys.memory_document(user, agent)
        with _redis_errors("loading a memory document"):
            text, rev = self.redis.hmget(key, ["doc", "rev"])
        if text is None:
            self._forget_parsed(key)
            return int(rev or 0), empty_document()
        text = str(text)
        with self._parsed_lock:
            hit = self._parsed.get(key)
            if hit is not None and hit[0] == text:
                self._parsed.move_to_end(key)
                # Callers may change what they get (update's callback does): a private copy.
                return int(rev or 0), copy_document(hit[1]) if copy else hit[1]
        try:
            document = parse_document(text)
        except (DocumentDecodeError, ValueError) as exc:
            self._forget_parsed(key)
            # No move-aside in Redis: the key is left as it is for an operator, and `update`
            # refuses to overwrite it (an explicit `save`, e.g. import or clear, replaces it).
            raise CorruptMemoryFile(
                f"Redis key {key} is not a valid memory document: {exc}"
            ) from exc
        if self._parsed_max > 0:
            with self._parsed_lock:
                self._parsed[key] = (text, document)
                self._parsed.move_to_end(key)
                while len(self._parsed) > self._parsed_max:
                    self._parsed.popitem(last=False)
            return int(rev or 0), copy_document(document) if copy else document
        return int(rev or 0), document

    def _forget_parsed(self, key: str) -> None:
        with self._parsed_lock:
            self._parsed.pop(key, None)

    def _store(
        self,
        user: str,
        agent: str | None,
        expected_revision: int,
        document: MemoryDocument,
        changes: list[Change],
        fence: Fence | None = None,
    ) -> bool:
        """True when saved, False on a revision conflict; StaleClaim when the fence refused."""
        entries = [encode_change(c) for c in changes] if self.history_max_entries else []
        keys = [self.keys.memory_document(user, agent), self.keys.memory_history(user, agent)]
        if fence is not None:
            shard = self.keys.for_context(fence.context_id)
            keys += (shard.context(fence.context_id), shard.watermark(fence.context_id))
        args = [
            expected_revision,
            dump_document(document),
            self.history_max_entries,
            fence.token if fence is not None else "",
            (fence.watermark or "") if fence is not None else "",
            self.watermark_ttl_ms,
            *entries,
        ]
        with _redis_errors("saving a memory document"):
            code, _revision = self._index_and_save(self.keys.index_member(user, agent), keys, args)
        if int(code) == 2 and fence is not None:
            with _redis_errors("saving a memory document"):
                if not self.redis.exists(keys[0]):  # indexed above for nothing
                    self.redis.srem(self.keys.memory_index(), self.keys.index_member(user, agent))
            raise StaleClaim(
                f"claim {fence.token} of {fence.context_id} is no longer current; not saved"
            )
        return int(code) == 1

    def _index_and_save(self, member: str, keys: list[str], args: list[Any]) -> Any:
        """Index the document, then run the save script. Indexed first: a crash between the two
        leaves an entry without a document (filtered on listing), never a document that `forget`
        cannot find. On one Redis both go in one round trip (a pipeline keeps their order);
        the index is in no document's hash slot, so on a cluster they are two calls."""
        index = self.keys.memory_index()
        if not isinstance(self.redis, redis.Redis):
            self.redis.sadd(index, member)
            return self._save_script(keys=keys, args=args)
        pipe = self.redis.pipeline(transaction=False)
        pipe.sadd(index, member)
        # EVALSHA itself: redis-py's Script in a pipeline asks SCRIPT EXISTS first, a round trip.
        pipe.evalsha(self._save_script.sha, len(keys), *keys, *args)
        indexed, saved = pipe.execute(raise_on_error=False)
        if isinstance(indexed, Exception):  # what refuses the index (OOM, READONLY) refuses both
            raise indexed
        if isinstance(saved, NoScriptError):  # a restarted Redis: the wrapper loads it, retries
            return self._save_script(keys=keys, args=args)
        if isinstance(saved, Exception):
            raise saved
        return saved

    def _indexed(self) -> list[tuple[str, str | None]]:
        """Indexed (user, agent) pairs whose document still exists."""
        with _redis_errors("listing memory documents"):
            members = sorted(str(m) for m in self.redis.smembers(self.keys.memory_index()))
            pairs: list[tuple[str, str | None]] = []
            for member in members:
                try:
                    pairs.append(self.keys.parse_index_member(member))
                except InvalidIdentifier:
                    continue  # not written by memq
            pipe = self.redis.pipeline(transaction=False)
            for owner, agent_name in pairs:
                pipe.exists(self.keys.memory_document(owner, agent_name))
            exists = pipe.execute()
        return [pair for pair, found in zip(pairs, exists, strict=True) if found]
