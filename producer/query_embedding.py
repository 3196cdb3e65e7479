"""The query's embedding at recall time: one short HTTP call, a cache, and BM25 when it fails.

Recall runs in the agent's turn (the injected block, search, MCP ``recall``, HTTP ``/context``),
so this client keeps the agent-side promises: a strict timeout (``embedding_timeout_seconds``,
0.3 s by default), a bounded LRU of recent queries (an agent asks about the same thing again and
again), the producer's skip-until back-off (an endpoint that hung a moment ago is not tried again on
every turn), and never an exception: :meth:`QueryEmbedder.embed` returns None and the ranking
falls back to BM25 alone, counted by reason (``recall_fallbacks:<reason>``).

It speaks the OpenAI ``POST /v1/embeddings`` wire format with httpx, not the `openai` SDK the
workers use: an agent process must not load the SDK (tests/test_layers.py), and one request of a
documented shape needs no SDK. The workers' batched client is :mod:`worker.embeddings`; both are
tested against the same scripted server (``memq.testing``).
"""

from __future__ import annotations

import collections
import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from memq.core.connection import RedisClient
from memq.core.metrics import MetricsRecorder
from memq.core.settings import MemqSettings
from producer.backoff import Backoff
from storage.vectors import unit

if TYPE_CHECKING:
    import httpx

    from storage.vectors import Vector

log = logging.getLogger(__name__)

# Why a query was ranked without its embedding (the label of ``recall_fallbacks:``).
FALLBACK_REASONS = ("timeout", "unreachable", "error", "backoff")
# Called once per fallback with its reason; must not block (see `counting_fallbacks`).
FallbackObserver = Callable[[str], None]


def _no_observer(reason: str) -> None:
    return None


class QueryEmbedder:
    """``embed(text)`` → the unit vector of ``text`` under :attr:`model`, or None (fall back).

    Thread-safe; build one per process from the settings (:func:`query_embedder`) and close it."""

    def __init__(
        self,
        *,
        base_url: str,
        model: str,
        api_key: str | None,
        timeout_seconds: float,
        cache_size: int,
        on_fallback: FallbackObserver = _no_observer,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.model = model
        self._url = base_url.rstrip("/") + "/embeddings"
        self._api_key = api_key
        self._timeout = timeout_seconds
        self._cache_size = cache_size
        self._cache: collections.OrderedDict[str, Vector] = collections.OrderedDict()
        self._lock = threading.Lock()
        self._backoff = Backoff()
        self._on_fallback = on_fallback
        self._transport = transport
        self._client: httpx.Client | None = None
        self.fallbacks: collections.Counter[str] = collections.Counter()
        # Built now, not on the first query: importing httpx and making its client take a
        # tenth of a second or more, which would eat the first recall's timeout.
        self._http()

    def _http(self) -> httpx.Client:
        with self._lock:
            if self._client is None:
                import httpx  # here: an agent without an embedding model never loads it

                headers = {"Authorization": f"Bearer {self._api_key}"} if self._api_key else {}
                self._client = httpx.Client(
                    timeout=httpx.Timeout(self._timeout),
                    headers=headers,
                    transport=self._transport,
                    trust_env=False,  # no proxy picked from the environment for a loopback call
                )
            return self._client

    def embed(self, text: str) -> Vector | None:
        """The query's unit vector, or None when it could not be had within the timeout."""
        if not text.strip():
            return None
        with self._lock:
            cached = self._cache.get(text)
            if cached is not None:
                self._cache.move_to_end(text)
                return cached
        if self._backoff.skipping():
            self._fallback("backoff")
            return None
        try:
            vector = self._request(text)
        except Exception as exc:
            reason = _reason(exc)
            if self._backoff.failed():
                log.warning(
                    "memq: the embedding endpoint failed (%s, %s); recall ranks by words "
                    "until it answers",
                    reason,
                    type(exc).__name__,
                )
            self._fallback(reason)
            return None
        if self._backoff.recovered():
            log.warning("memq: the embedding endpoint answers again; recall ranks by meaning")
        if self._cache_size:
            with self._lock:
                self._cache[text] = vector
                while len(self._cache) > self._cache_size:
                    self._cache.popitem(last=False)
        return vector

    def _request(self, text: str) -> Vector:
        response = self._http().post(self._url, json={"model": self.model, "input": [text]})
        response.raise_for_status()
        vector = unit(_first_embedding(response.json()))
        if vector is None:
            raise ValueError("the embedding endpoint answered an empty or zero vector")
        return vector

    def _fallback(self, reason: str) -> None:
        with self._lock:
            self.fallbacks[reason] += 1
        try:
            self._on_fallback(reason)
        except Exception:
            log.debug("recording a recall fallback failed", exc_info=True)

    def close(self) -> None:
        with self._lock:
            client, self._client = self._client, None
        if client is not None:
            client.close()


def _first_embedding(body: Any) -> list[float]:
    data = body.get("data") if isinstance(body, dict) else None
    if not isinstance(data, list) or not data or not isinstance(data[0], dict):
        raise ValueError("the embedding endpoint's answer has no data[0]")
    values = data[0].get("embedding")
    if not isinstance(values, list):
        raise ValueError("data[0].embedding is not a list of numbers")
    return [float(v) for v in values]


def _reason(exc: Exception) -> str:
    import httpx

    if isinstance(exc, httpx.TimeoutException):
        return "timeout"
    if isinstance(exc, httpx.TransportError):
        return "unreachable"
    return "error"


class RecordedFallbacks:
    """A :data:`FallbackObserver` that adds fallbacks to the shared ``recall_fallbacks`` counter
    from a background thread: the agent's turn never waits for the metrics write (at most one
    write is under way; fallbacks meanwhile are added to the next)."""

    def __init__(self, record: Callable[[int], None]) -> None:
        self._record = record
        self._lock = threading.Lock()
        self._pending = 0
        self._writing = False

    def __call__(self, reason: str) -> None:
        with self._lock:
            self._pending += 1
            if self._writing:
                return
            self._writing = True
        threading.Thread(target=self._flush, name="memq-recall-fallbacks", daemon=True).start()

    def _flush(self) -> None:
        while True:
            with self._lock:
                count, self._pending = self._pending, 0
                if not count:
                    self._writing = False
                    return
            self._record(count)  # MetricsRecorder.count: logs, never raises


def query_embedder(
    settings: MemqSettings,
    client: RedisClient | None = None,
    *,
    on_fallback: FallbackObserver | None = None,
) -> QueryEmbedder | None:
    """The recall-time embedder the settings ask for; None when no embedding model is set.
    With a Redis ``client`` its fallbacks add to the shared ``recall_fallbacks`` counter."""
    if on_fallback is None:
        if client is not None:
            recorder = MetricsRecorder.for_settings(settings, client)
            on_fallback = RecordedFallbacks(lambda n: recorder.count(recall_fallbacks=n))
        else:
            on_fallback = _no_observer
    if not settings.embedding_model:
        return None
    key = settings.effective_embedding_api_key
    return QueryEmbedder(
        base_url=settings.effective_embedding_base_url,
        model=settings.embedding_model,
        api_key=key.get_secret_value() if key is not None else None,
        timeout_seconds=settings.embedding_timeout_seconds,
        cache_size=settings.embedding_query_cache_size,
        on_fallback=on_fallback,
    )
