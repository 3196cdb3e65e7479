"""Memory documents in Redis, for replicas and workers on different hosts (``MEMQ_STORAGE=redis``).

Each (user, agent) is a hash ``{doc, rev, gen}`` beside a history list, both under one hash tag.
An update is optimistic: apply the callback to the document as last read (with its revision and
generation), and write back with a Lua compare-and-set that also appends the history; on a
conflict the callback runs again on the newer document, which the refusal carries. So concurrent
updates from any number of workers all survive, and nobody holds a lock across a slow callback.
"""

from __future__ import annotations

import contextlib
import logging
import random
import secrets
import threading
import time
from collections import OrderedDict
from collections.abc import Iterator
from dataclasses import dataclass
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


@dataclass(frozen=True, slots=True)
class _Version:
    """Which stored document a read saw: its revision, and its generation (set when it was
    created, so a document deleted and created again is never taken for the one read)."""

    revision: int = 0
    generation: str = ""


@dataclass(frozen=True, slots=True)
class _Read:
    """One document as this process last read it: its text (None: there was none), the version
    it was read at, and its parse."""

    text: str | None
    version: _Version
    document: MemoryDocument


_UNCONDITIONAL = _Version(-1)  # a save that replaces whatever is stored
_UNSENT = object()  # a pending read's reply before it came (or when it was never queued)


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
        # The version it was read at comes with it: an update starts from the document as last
        # read, and the save's compare-and-set says whether it still is.
        self._parsed: OrderedDict[str, _Read] = OrderedDict()
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
        self._store(user, agent, _UNCONDITIONAL, stamp_for_save(document), changes or [])

    def pending_read(self, user_id: str | None, agent_name: str | None) -> _PendingRead:
        """A :meth:`load` to send in another caller's pipeline on this store's Redis
        (:class:`storage.base.PendingRead`)."""
        user, agent = validate_user_id(user_id), validate_agent_name(agent_name)
        return _PendingRead(self, user, agent)

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
        # First on the document as this process last read it (a worker read it for the prompt
        # a moment ago), without reading it again: the save's compare-and-set refuses it if it
        # changed since, and the refusal carries the document as it is now. So an update takes
        # one round trip when nothing changed, two when something did.
        read = self._kept(self.keys.memory_document(user, agent))
        while True:
            checked = read is None  # read now, or handed back by a refused save
            version, current = read if read is not None else self._fetch(user, agent)
            read = None
            before = copy_document(current)  # the callback may change its argument in place
            document, changes = split_update_result(fn(current))
            if document == before and not changes:
                if checked:
                    return document
                continue  # judged on a document that may have changed: judge the latest
            saved = stamp_for_save(document)
            stored, newer = self._store(user, agent, version, saved, changes, fence)
            if stored:
                return saved
            if time.monotonic() >= deadline:
                raise LockTimeout(
                    f"memory of user={user} agent={agent or '-'} kept changing under "
                    f"{attempt + 1} attempts for {self.conflict_timeout_seconds:g} s"
                )
            attempt += 1
            read = newer
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
            version, current = self._fetch(user, agent)
            revision = version.revision
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
                    self._forget_parsed(keys[0])
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
    ) -> tuple[_Version, MemoryDocument]:
        key = self.keys.memory_document(user, agent)
        with _redis_errors("loading a memory document"):
            text, rev, gen = self.redis.hmget(key, ["doc", "rev", "gen"])
        read = self._decoded(key, text, rev, gen)
        return read.version, copy_document(read.document) if copy else read.document

    def _decoded(self, key: str, text: Any, rev: Any, gen: Any) -> _Read:
        """The document of ``key`` stored as ``text`` at ``rev``/``gen``, parsed unless the text
        is the one kept (the result is shared: copy it before handing it to a caller that may
        change it), and kept as this process's last read of it."""
        version = _Version(int(rev or 0), str(gen or ""))
        if text is None:
            read = _Read(None, version, empty_document())
            self._keep(key, read)
            return read
        text = str(text)
        with self._parsed_lock:
            hit = self._parsed.get(key)
            if hit is not None and hit.text == text:
                read = _Read(text, version, hit.document)
                self._parsed[key] = read
                self._parsed.move_to_end(key)
                return read
        try:
            document = parse_document(text)
        except (DocumentDecodeError, ValueError) as exc:
            self._forget_parsed(key)
            # No move-aside in Redis: the key is left as it is for an operator, and `update`
            # refuses to overwrite it (an explicit `save`, e.g. import or clear, replaces it).
            raise CorruptMemoryFile(
                f"Redis key {key} is not a valid memory document: {exc}"
            ) from exc
        read = _Read(text, version, document)
        self._keep(key, read)
        return read

    def _keep(self, key: str, read: _Read) -> None:
        if self._parsed_max <= 0:
            return
        with self._parsed_lock:
            self._parsed[key] = read
            self._parsed.move_to_end(key)
            while len(self._parsed) > self._parsed_max:
                self._parsed.popitem(last=False)

    def _kept(self, key: str) -> tuple[_Version, MemoryDocument] | None:
        """This process's last read of ``key`` (a private copy), if it still keeps it."""
        with self._parsed_lock:
            hit = self._parsed.get(key)
        return None if hit is None else (hit.version, copy_document(hit.document))

    def _forget_parsed(self, key: str) -> None:
        with self._parsed_lock:
            self._parsed.pop(key, None)

    def _store(
        self,
        user: str,
        agent: str | None,
        expected: _Version,
        document: MemoryDocument,
        changes: list[Change],
        fence: Fence | None = None,
    ) -> tuple[bool, tuple[_Version, MemoryDocument] | None]:
        """(True, None) when saved; (False, the document as stored now) on a conflict;
        StaleClaim when the fence refused."""
        entries = [encode_change(c) for c in changes] if self.history_max_entries else []
        key = self.keys.memory_document(user, agent)
        keys = [key, self.keys.memory_history(user, agent)]
        if fence is not None:
            shard = self.keys.for_context(fence.context_id)
            keys += (shard.context(fence.context_id), shard.watermark(fence.context_id))
        args = [
            expected.revision,
            dump_document(document),
            self.history_max_entries,
            fence.token if fence is not None else "",
            (fence.watermark or "") if fence is not None else "",
            self.watermark_ttl_ms,
            expected.generation,
            secrets.token_hex(8),  # the generation, if this save creates the document
            *entries,
        ]
        with _redis_errors("saving a memory document"):
            reply = self._index_and_save(self.keys.index_member(user, agent), keys, args)
        code = int(reply[0])
        if code == 2 and fence is not None:
            with _redis_errors("saving a memory document"):
                if not self.redis.exists(keys[0]):  # indexed above for nothing
                    self.redis.srem(self.keys.memory_index(), self.keys.index_member(user, agent))
            raise StaleClaim(
                f"claim {fence.token} of {fence.context_id} is no longer current; not saved"
            )
        if code == 1:
            # What this process kept of the document is older than what it wrote.
            self._forget_parsed(key)
            return True, None
        _, rev, text, gen = reply
        read = self._decoded(key, text, rev, gen)
        return False, (read.version, copy_document(read.document))

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


class _PendingRead:
    """One document's read, queued on a plain pipeline of the store's own client, or made by
    :meth:`document` when it was not (another client, a cluster: its keys would need their own
    round trip anyway)."""

    def __init__(self, store: RedisMemoryStorage, user_id: str, agent_name: str | None) -> None:
        self.user_id, self.agent_name = user_id, agent_name
        self._store = store
        self._key = store.keys.memory_document(user_id, agent_name)
        self._reply: Any = _UNSENT

    def queue(self, pipe: Any) -> bool:
        client = self._store.redis
        if not isinstance(client, redis.Redis) or not isinstance(pipe, redis.client.Pipeline):
            return False
        if pipe.connection_pool is not client.connection_pool:
            return False
        pipe.hmget(self._key, ["doc", "rev", "gen"])
        return True

    def take(self, reply: Any) -> None:
        self._reply = reply

    def document(self) -> MemoryDocument:
        """What :meth:`RedisMemoryStorage.load` gives (a private copy, kept as this process's
        last read), raising as it would."""
        reply, self._reply = self._reply, _UNSENT
        if reply is _UNSENT:
            return self._store.load(self.user_id, self.agent_name)
        if isinstance(reply, Exception):
            with _redis_errors("loading a memory document"):
                raise reply
        text, rev, gen = reply
        return copy_document(self._store._decoded(self._key, text, rev, gen).document)
