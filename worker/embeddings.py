"""Fact embeddings on the worker side: the batched ``/v1/embeddings`` client and "embed what is
missing", shared by every extraction (both lanes) and by ``memq reembed``.

:class:`OpenAIEmbedder` is the `openai` SDK's ``embeddings.create`` against the configured
endpoint (``MEMQ_EMBEDDING_BASE_URL``/``_API_KEY``, defaulting to the LLM's), up to
``embedding_batch_size`` texts per request. :func:`embed_missing` reads a document, embeds the
fact texts that have no vector of the model yet, in one request per batch, and stores the vectors
with an atomic ``update`` that keeps only those of texts still in the document (an extraction that
ran meanwhile loses nothing and gains no stale vector). It runs after a run's fenced save, never
inside it: the model call is I/O and may fail, and an extraction's facts are saved whether or not
their vectors could be had — a failure is logged, counted (``embedding_failures``), and made up by
the next extraction of that memory or by ``memq reembed``.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import openai

from memq.core.settings import MemqSettings
from storage.base import MemoryStorage
from storage.document import MemoryDocument
from storage.vectors import missing_texts, with_vectors

log = logging.getLogger(__name__)

_PLACEHOLDER_KEY = "not-needed"  # local OpenAI-compatible servers often want no key at all


@dataclass(frozen=True, slots=True)
class Embedded:
    """The vectors of one batch of texts, in order, and the tokens the endpoint counted."""

    vectors: list[list[float]]
    tokens: int


class OpenAIEmbedder:
    """``embed(texts)`` → their vectors, one request per ``batch_size`` texts."""

    def __init__(self, settings: MemqSettings, *, client: openai.OpenAI | None = None) -> None:
        if not settings.embedding_model:
            raise ValueError("no embedding model is configured (MEMQ_EMBEDDING_MODEL)")
        key = settings.effective_embedding_api_key
        self.model = settings.embedding_model
        self.batch_size = settings.embedding_batch_size
        self._client = client or openai.OpenAI(
            api_key=(key.get_secret_value() if key is not None else None) or _PLACEHOLDER_KEY,
            base_url=settings.effective_embedding_base_url,
            timeout=settings.llm_timeout_seconds,
            max_retries=settings.llm_max_retries,
        )

    def embed(self, texts: Sequence[str]) -> Embedded:
        """The vectors of ``texts`` (at most ``batch_size`` of them: one request)."""
        if len(texts) > self.batch_size:
            raise ValueError(f"at most {self.batch_size} texts per request, got {len(texts)}")
        response = self._client.embeddings.create(
            model=self.model, input=list(texts), encoding_format="float"
        )
        ordered = sorted(response.data, key=lambda item: item.index)
        if len(ordered) != len(texts):
            raise ValueError(f"asked for {len(texts)} embeddings, got {len(ordered)}")
        usage = getattr(response, "usage", None)
        tokens = int(getattr(usage, "total_tokens", 0) or 0)
        return Embedded([list(item.embedding) for item in ordered], tokens)

    def close(self) -> None:
        self._client.close()


# Asked before each request with its estimated tokens; may raise RunDeferred (budget, rate limit).
EmbedGate = Callable[[int], None]


def _no_gate(tokens: int) -> None:
    return None


def batches(texts: Sequence[str], size: int) -> list[list[str]]:
    return [list(texts[i : i + size]) for i in range(0, len(texts), size)]


def embed_missing(
    storage: MemoryStorage,
    user_id: str,
    agent_name: str | None,
    embedder: OpenAIEmbedder,
    *,
    gate: EmbedGate = _no_gate,
    document: MemoryDocument | None = None,
    keep_other_models: bool = True,
) -> tuple[int, int]:
    """Embed the facts of that memory that have no vector of the embedder's model; returns
    (texts embedded, tokens the endpoint counted). ``document``: the one just saved (saves a
    read). Raises what the endpoint raised (nothing stored from the failing batch on)."""
    current = document if document is not None else storage.load(user_id, agent_name)
    model = embedder.model
    todo = missing_texts(current.embeddings, model, (f.content for f in current.facts))
    if not todo and (keep_other_models or set(current.embeddings) <= {model}):
        return 0, 0
    done = 0
    tokens = 0
    for batch in batches(todo, embedder.batch_size) or [[]]:
        if batch:
            gate(sum(len(text) for text in batch) // 4 + 1)
            answer = embedder.embed(batch)
            tokens += answer.tokens
            vectors = dict(zip(batch, answer.vectors, strict=True))
        else:
            vectors = {}

        def attach(latest: MemoryDocument, new: dict[str, list[float]] = vectors) -> MemoryDocument:
            texts = {f.content for f in latest.facts}
            kept = {text: values for text, values in new.items() if text in texts}
            latest.embeddings = with_vectors(
                latest.embeddings, model, kept, keep_other_models=keep_other_models
            )
            return latest

        storage.update(user_id, agent_name, attach)
        done += len(batch)
    return done, tokens


class FactEmbedding:
    """What an extraction does after its save: embed the memory's new and edited fact texts
    (one request per ``embedding_batch_size`` texts), never failing the run (see above)."""

    def __init__(
        self,
        embedder: OpenAIEmbedder,
        *,
        count: Callable[..., None] | None = None,
    ) -> None:
        self.embedder = embedder
        self._count = count  # MetricsRecorder.count: facts_embedded, embedding_failures

    def after_save(self, storage: MemoryStorage, user_id: str, agent_name: str | None) -> int:
        """Texts embedded (0 on a failure, which is logged and counted)."""
        try:
            done, _ = embed_missing(storage, user_id, agent_name, self.embedder)
        except Exception as exc:
            log.warning(
                "embedding new facts failed (%s); they rank by words until `memq reembed` or "
                "the next extraction of this memory",
                type(exc).__name__,
            )
            log.debug("embedding error", exc_info=True)
            if self._count is not None:
                self._count(embedding_failures=1)
            return 0
        if done and self._count is not None:
            self._count(facts_embedded=done)
        return done


def build_fact_embedding(
    settings: MemqSettings, count: Callable[..., None] | None = None
) -> FactEmbedding | None:
    """The settings' fact embedding, or None when no embedding model is configured."""
    if not settings.embedding_model:
        return None
    return FactEmbedding(OpenAIEmbedder(settings), count=count)
