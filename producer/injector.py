"""The agent-side reader: the ``<user_memory>`` block for the next prompt.

Every call reads the latest memory (DeerFlow froze it per thread, so what a thread taught
was only seen by the next one): one Redis round trip with the default backend (the file
backend keeps a stat-checked cache, so its reads stay cheap too). Injection is
best effort: any failure is logged and the agent simply gets no memory for that turn.

The read runs before every agent turn, so it gets the producer's protections: a Redis client with
the short ``injector_timeout_seconds`` (built here unless a storage is passed in), and the same
skip-until back-off (:mod:`producer.backoff`): when Redis does not answer, a turn waits at most one
timeout, and the turns after it do not try Redis again until the back-off ends. :meth:`load` and
:meth:`text` are the strict reads (they raise :class:`RedisUnavailable`, also while backing off);
:meth:`block` fails open.
"""

from __future__ import annotations

import logging
import threading
from datetime import datetime

from memq.core.connection import RedisClient, redis_client
from memq.core.errors import RedisUnavailable
from memq.core.identity import DEFAULT_USER_ID
from memq.core.settings import MemqSettings, load_settings
from memq.memory.blocks import INJECTED_MEMORY_TAG
from producer.backoff import Backoff
from producer.query_embedding import query_embedder
from prompts.injection import Injection, LeftOut, format_memory_for_injection
from prompts.injection import warm as warm_recall
from prompts.tokens import TokenCounter, make_token_counter
from storage.base import MemoryStorage, SharedReads
from storage.document import MemoryDocument
from storage.location import check_reader_soon
from storage.search import QueryEmbedding, meaning_for

log = logging.getLogger(__name__)

OPEN_TAG = f"<{INJECTED_MEMORY_TAG}>"
CLOSE_TAG = f"</{INJECTED_MEMORY_TAG}>"


def wrapped(content: str) -> str:
    """The memory text inside its tags, or "" when there is nothing to say."""
    if not content.strip():
        return ""
    return f"{OPEN_TAG}\n{content}\n{CLOSE_TAG}"


class MemoryInjector:
    """``MemoryInjector().block(user_id, agent_name)`` → the block to put before the user's turn.

    With ``storage`` omitted the backend is built from the settings on first use, on a Redis client
    with ``injector_timeout_seconds`` (closed by :meth:`close`); a storage passed in is used as it
    is configured, so give its client a short timeout too."""

    def __init__(
        self,
        settings: MemqSettings | None = None,
        storage: MemoryStorage | None = None,
        *,
        embedder: QueryEmbedding | None = None,
    ) -> None:
        self._settings = settings
        self._storage = storage
        # None: built from the settings on first use (when they name an embedding model).
        self._embedder = embedder
        self._embedder_ready = embedder is not None
        self._owns_embedder = embedder is None
        self._client: RedisClient | None = None
        self._counter: TokenCounter | None = None
        self._setup_lock = threading.Lock()
        self._backoff = Backoff()

    def _ready(self) -> tuple[MemqSettings, MemoryStorage, TokenCounter]:
        # Built on first use, inside `block`'s safety net: a bad config or an unreachable backend
        # must not break the agent that merely constructed an injector.
        with self._setup_lock:
            if self._settings is None:
                self._settings = load_settings()
            if self._storage is None:
                from storage import get_storage
                from storage.backends import backend_for

                settings = self._settings
                if backend_for(settings).reads_from_redis:
                    self._client = redis_client(
                        settings, socket_timeout=settings.injector_timeout_seconds
                    )
                self._storage = get_storage(settings, redis=self._client)
            if self._counter is None:
                self._counter = make_token_counter(self._settings.token_counting)
            if not self._embedder_ready:
                self._embedder = self._build_embedder(self._settings)
                self._embedder_ready = True
            return self._settings, self._storage, self._counter

    def _build_embedder(self, settings: MemqSettings) -> QueryEmbedding | None:
        return query_embedder(settings, self._client)

    def embedder(self) -> QueryEmbedding | None:
        """The query embedder this injector ranks with (built from the settings on first use;
        None without an embedding model): share it with a MemoryManager's search."""
        self._ready()
        return self._embedder

    def warm(self) -> None:
        """Load the tokenizer and the segmenter now, at process start, so the first recall costs
        what later ones do (call it where the agent's process starts; it never raises: a failure
        only means the first recall pays the loading)."""
        try:
            _, _, counter = self._ready()
            warm_recall(counter)
        except Exception:  # warming is an optimisation; the first call still works without it
            log.warning("memq: warming the recall's tokenizer failed", exc_info=True)

    def load(self, user_id: str | None, agent_name: str | None = None) -> MemoryDocument:
        """The stored memory document, read with the short timeout and the back-off: the strict
        read (for a backend that reports an outage to its framework). Raises
        :class:`RedisUnavailable` when Redis did not answer, at once while backing off after
        that; other storage errors as the backend raises them."""
        _, storage, _ = self._ready()
        return self._guarded_load(storage, user_id, agent_name)

    def _guarded_load(
        self,
        storage: MemoryStorage,
        user_id: str | None,
        agent_name: str | None,
        *,
        shared: bool = False,
    ) -> MemoryDocument:
        """The stored document; with ``shared``, the backend's own parse where it offers one
        (:class:`SharedReads`): the caller only reads it, and never changes it."""
        read = storage.view if shared and isinstance(storage, SharedReads) else storage.load
        if self._backoff.skipping():
            raise RedisUnavailable(
                "memory read skipped: Redis did not answer a moment ago (backing off)"
            )
        try:
            document = read(DEFAULT_USER_ID if user_id is None else user_id, agent_name)
        except RedisUnavailable as exc:
            if self._backoff.failed():
                log.warning(
                    "memq: Redis unavailable, injecting no memory until it answers: %s", exc
                )
            raise
        if self._backoff.recovered():
            log.warning("memq: Redis reachable again; injecting memory")
        check_reader_soon(self._settings, "injector", self._client)  # once: workers elsewhere?
        return document

    def text(
        self,
        user_id: str | None,
        agent_name: str | None = None,
        *,
        query: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
    ) -> str:
        """The memory text without the wrapper; raises on failure (for tools and the CLI), like
        :meth:`load`.

        ``query`` (typically the user's latest message) fills the budget by relevance blended
        with confidence; without it facts come by confidence alone. ``since``/``until``: only
        the facts said within that window."""
        return self.plan(user_id, agent_name, query=query, since=since, until=until).text

    def plan(
        self,
        user_id: str | None,
        agent_name: str | None = None,
        *,
        query: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        explain: bool = False,
    ) -> Injection:
        """:meth:`text`, and with ``explain`` the facts it left out and why (the inspector's
        preview: the same decision). Raises like :meth:`text`."""
        settings, storage, counter = self._ready()
        if not (settings.enabled and settings.injection_enabled):
            return Injection("", ())
        # Rendering only reads the document: no private copy of it on every turn.
        document = self._guarded_load(storage, user_id, agent_name, shared=True)
        meaning = None
        embedder = self._embedder
        if embedder is not None and query is not None and query.strip() and document.facts:
            # Bounded by the embedder's own timeout; None (fall back to words) on any failure.
            meaning = meaning_for(document.embeddings, embedder.model, embedder.embed(query))
        left: list[LeftOut] | None = [] if explain else None
        text = format_memory_for_injection(
            document,
            settings.injected_memory_max_tokens,
            guaranteed_categories=settings.guaranteed_categories,
            guaranteed_token_budget=settings.guaranteed_token_budget,
            count_tokens=counter,
            query=query,
            meaning=meaning,
            since=since,
            until=until,
            left_out=left,
        )
        return Injection(text, tuple(left or ()))

    def block(
        self,
        user_id: str | None,
        agent_name: str | None = None,
        *,
        query: str | None = None,
        since: datetime | None = None,
        until: datetime | None = None,
        strict: bool = False,
    ) -> str:
        """``"<user_memory>\\n…\\n</user_memory>"``, or ``""`` when there is nothing to inject,
        injection is disabled, or anything went wrong (logged; never raised into the agent).
        ``query``, ``since``, ``until``: see :meth:`text`. ``strict``: failures raise as
        :meth:`text` raises them (a tool that must not pass an outage off as "nothing known")."""
        try:
            content = self.text(user_id, agent_name, query=query, since=since, until=until)
        except RedisUnavailable:
            if strict:
                raise
            return ""  # logged once per outage by the read itself
        except Exception:
            if strict:
                raise
            log.exception("memory injection failed for user=%s agent=%s", user_id, agent_name)
            return ""
        if not content.strip():
            return ""
        return wrapped(content)

    def close(self) -> None:
        """Close the Redis client the injector built (a storage passed in is the caller's)."""
        with self._setup_lock:
            client, self._client = self._client, None
            embedder = self._embedder if self._owns_embedder else None
            if self._owns_embedder:
                self._embedder, self._embedder_ready = None, False
        if client is not None:
            client.close()
        close = getattr(embedder, "close", None)
        if close is not None:  # only the embedder it built: one passed in is the caller's
            close()
