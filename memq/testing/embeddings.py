"""The scripted server's ``POST /v1/embeddings``: deterministic vectors, a settable delay or hang.

A text's vector is a hashed bag of its words and of its words' character trigrams, in
:data:`DIMENSIONS` dimensions, L2-normalised: texts sharing words or word pieces ("photography",
"photographs") point the same way, so a test can show a fact found by its embedding that BM25's
whole-word match misses, with the real `openai` client and real HTTP, and no model. The answer has
the shape of OpenAI's: ``{"object": "list", "data": [{"object": "embedding", "index": i,
"embedding": [...]}], "model": ..., "usage": {"prompt_tokens": n, "total_tokens": n}}``; the
request's ``dimensions`` (when given) sets the length, as OpenAI's text-embedding-3 models do.
"""

from __future__ import annotations

import hashlib
import math
import re
import threading
import time
from typing import Any

DIMENSIONS = 64
_WORDS = re.compile(r"[^\W_]+")


def _bucket(piece: str, dimensions: int) -> tuple[int, float]:
    digest = hashlib.blake2b(piece.encode("utf-8"), digest_size=8).digest()
    value = int.from_bytes(digest, "little")
    return value % dimensions, (1.0 if (value >> 63) & 1 else -1.0)


def scripted_embedding(text: str, dimensions: int = DIMENSIONS) -> list[float]:
    """The deterministic unit vector of ``text`` (all zeros for a text without a word)."""
    vector = [0.0] * dimensions
    for word in _WORDS.findall(text.casefold()):
        index, sign = _bucket("w:" + word, dimensions)
        vector[index] += 2.0 * sign
        padded = f"<{word}>"
        for start in range(len(padded) - 2):
            index, sign = _bucket("t:" + padded[start : start + 3], dimensions)
            vector[index] += sign
    norm = math.sqrt(sum(v * v for v in vector))
    return [v / norm for v in vector] if norm else vector


class ScriptedEmbeddings:
    """What the server does with ``/v1/embeddings``: ``delay_seconds`` before each answer,
    ``hang()`` to answer nothing until ``release()`` (or the server stops); ``requests`` holds
    each request's list of inputs."""

    def __init__(self) -> None:
        self.delay_seconds = 0.0
        self.status = 200  # another status: an OpenAI-shaped error body instead
        self.requests: list[list[str]] = []
        self._lock = threading.Lock()
        self._released = threading.Event()
        self._released.set()

    def hang(self) -> None:
        self._released.clear()

    def release(self) -> None:
        self._released.set()

    @property
    def inputs(self) -> list[str]:
        with self._lock:
            return [text for request in self.requests for text in request]

    def answer(self, request: dict[str, Any]) -> tuple[int, dict[str, Any]]:
        raw = request.get("input", [])
        texts = [raw] if isinstance(raw, str) else [str(t) for t in raw if isinstance(t, str)]
        with self._lock:
            self.requests.append(texts)
        self._released.wait()
        if self.delay_seconds:
            time.sleep(self.delay_seconds)  # wait-ok: a slow embedder, as scripted
        if self.status != 200:
            return self.status, {"error": {"message": f"scripted {self.status}", "type": "x"}}
        if not texts:
            return 400, {"error": {"message": "input must not be empty", "type": "invalid"}}
        dims = request.get("dimensions")
        size = dims if isinstance(dims, int) and 1 <= dims <= 4096 else DIMENSIONS
        tokens = sum(len(_WORDS.findall(t)) for t in texts)
        return 200, {
            "object": "list",
            "data": [
                {"object": "embedding", "index": i, "embedding": scripted_embedding(t, size)}
                for i, t in enumerate(texts)
            ],
            "model": str(request.get("model", "scripted-embedding")),
            "usage": {"prompt_tokens": tokens, "total_tokens": tokens},
        }
