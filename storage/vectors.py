"""Fact embeddings kept beside the document: one compact set per embedding model.

A document's ``embeddings`` maps an embedding model's name to a :class:`VectorSet`: the vector of
each fact *text*, keyed by a short hash of that text (:func:`content_key`), stored as base64 of
little-endian float16 (384 dimensions → 1,024 characters; float32 would double it for no ranking
gain at this precision). Keyed by text, not by fact id, a vector can never describe words a fact no
longer says: an edited fact simply has no vector until it is embedded again, a fact whose text is
unchanged keeps its vector through merges and imports, and :func:`pruned` (run on every save, by
both backends) drops the vector of every text that left the document, so forgetting a fact or a
thread forgets its vector too. Keyed by model, a model change never mixes two vector spaces: the
ranking reads the configured model's set only.

Pure functions on typed data; numpy is imported when a vector is first decoded (an agent process
that never ranks by meaning never loads it).
"""

from __future__ import annotations

import base64
import functools
import hashlib
import logging
from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from pydantic import BaseModel, Field, ValidationError, field_validator

if TYPE_CHECKING:
    import numpy as np
    import numpy.typing as npt

    Vector = npt.NDArray[np.float32]

log = logging.getLogger(__name__)

# Longer than any model memq would be pointed at (text-embedding-3-large: 3,072); a bound, so one
# bad answer cannot make a document grow without limit.
MAX_DIMENSIONS = 8192
_KEY_CHARS = 16  # 64 bits of SHA-256: no collision among a document's few hundred facts
_DECODED_CACHE_SIZE = 50_000


@functools.lru_cache(maxsize=_DECODED_CACHE_SIZE)
def content_key(text: str) -> str:
    """The key of a fact text's vector: a short hash of the exact text."""
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:_KEY_CHARS]


class VectorSet(BaseModel):
    """The vectors one embedding model gave a document's fact texts."""

    dimensions: int = Field(ge=1, le=MAX_DIMENSIONS)
    # content_key(fact text) → base64 of little-endian float16, ``dimensions`` of them.
    vectors: dict[str, str] = Field(default_factory=dict)

    @field_validator("vectors", mode="before")
    @classmethod
    def _readable(cls, value: Any) -> dict[str, str]:
        # A hand-edited or truncated file: drop what is unusable, never the document.
        if not isinstance(value, Mapping):
            return {}
        return {k: v for k, v in value.items() if isinstance(k, str) and isinstance(v, str)}


def readable_sets(value: Any) -> dict[str, VectorSet]:
    """A document's ``embeddings`` as read: the sets that validate, the rest dropped (logged),
    never the document — vectors can always be made again (`memq reembed`)."""
    if not isinstance(value, Mapping):
        return {}
    kept: dict[str, VectorSet] = {}
    for model, raw in value.items():
        try:
            kept[str(model)] = raw if isinstance(raw, VectorSet) else VectorSet.model_validate(raw)
        except ValidationError:
            log.warning("dropping unreadable fact vectors")
    return kept


def encode_vector(values: Sequence[float]) -> str:
    """A vector as stored: base64 of little-endian float16."""
    import numpy as np

    return base64.b64encode(np.asarray(values, dtype="<f2").tobytes()).decode("ascii")


@functools.lru_cache(maxsize=_DECODED_CACHE_SIZE)
def decode_vector(text: str, dimensions: int) -> Vector | None:
    """The stored vector as float32, unit length; None when it is not ``dimensions`` long or is
    all zeros (nothing to compare). Cached: the same memory is ranked on every turn."""
    import numpy as np

    try:
        raw = base64.b64decode(text, validate=True)
    except ValueError:
        return None
    if len(raw) != 2 * dimensions:
        return None
    vector = np.frombuffer(raw, dtype="<f2").astype(np.float32)
    norm = float(np.linalg.norm(vector))
    if not np.isfinite(norm) or norm == 0.0:
        return None
    result: Vector = vector / norm
    result.setflags(write=False)  # shared through the cache
    return result


def missing_texts(
    embeddings: Mapping[str, VectorSet], model: str, texts: Iterable[str]
) -> list[str]:
    """The distinct texts (in first-seen order) that have no vector of ``model`` yet."""
    have = embeddings.get(model)
    known = have.vectors if have is not None else {}
    seen: dict[str, None] = {}
    for text in texts:
        if text.strip() and content_key(text) not in known:
            seen.setdefault(text, None)
    return list(seen)


def with_vectors(
    embeddings: Mapping[str, VectorSet],
    model: str,
    vectors: Mapping[str, Sequence[float]],
    *,
    keep_other_models: bool = True,
) -> dict[str, VectorSet]:
    """``embeddings`` with ``vectors`` (text → values) added to ``model``'s set. A vector whose
    length differs from the set's dimensions replaces the set (the model behind the name
    changed its size: the old vectors are of another space)."""
    result = dict(embeddings) if keep_other_models else {}
    current = embeddings.get(model)
    for text, values in vectors.items():
        dimensions = len(values)
        if not 1 <= dimensions <= MAX_DIMENSIONS:
            continue
        if current is None or current.dimensions != dimensions:
            current = VectorSet(dimensions=dimensions)
        else:
            current = current.model_copy(update={"vectors": dict(current.vectors)})
        current.vectors[content_key(text)] = encode_vector(values)
    if current is not None:
        result[model] = current
    return result


def pruned(embeddings: Mapping[str, VectorSet], texts: Iterable[str]) -> dict[str, VectorSet]:
    """Only the vectors of ``texts`` (the document's current fact texts); empty sets dropped."""
    wanted = {content_key(text) for text in texts}
    result: dict[str, VectorSet] = {}
    for model, vector_set in embeddings.items():
        kept = {k: v for k, v in vector_set.vectors.items() if k in wanted}
        if kept:
            result[model] = (
                vector_set
                if len(kept) == len(vector_set.vectors)
                else vector_set.model_copy(update={"vectors": kept})
            )
    return result


def vectors_for(vector_set: VectorSet | None, texts: Sequence[str]) -> list[Vector | None]:
    """The unit vector of each text in ``vector_set`` (None where it has none)."""
    if vector_set is None:
        return [None] * len(texts)
    stored = vector_set.vectors
    out: list[Vector | None] = []
    for text in texts:
        encoded = stored.get(content_key(text))
        out.append(None if encoded is None else decode_vector(encoded, vector_set.dimensions))
    return out


def unit(values: Sequence[float]) -> Vector | None:
    """A query embedding as a unit float32 vector (None: empty, zero or not finite)."""
    import numpy as np

    vector = np.asarray(values, dtype=np.float32)
    if vector.ndim != 1 or not vector.size or vector.size > MAX_DIMENSIONS:
        return None
    norm = float(np.linalg.norm(vector))
    if not np.isfinite(norm) or norm == 0.0:
        return None
    result: Vector = vector / norm
    return result
