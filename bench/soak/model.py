"""The soak's scripted model: realistic latency, ~10 % faults, and one fact per marker it is shown.

Only the ``<conversation>`` slot of the update prompt is new (already-extracted messages come in
``<earlier_messages>``, the memory in ``<current_memory>``), so only markers found there become
facts. Each fact also names the call that wrote it, so two runs that both wrote one context version
leave two distinct facts instead of one deduplicated one.
"""

from __future__ import annotations

import random
import re
import threading
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

from bench.soak.oracle import MARKER
from memq.memory.update import NewFact, UpdateAnswer
from memq.testing.openai_server import update_text
from memq.testing.replies import Reply

_CONVERSATION = re.compile(r"<conversation>\n([\s\S]*?)\n</conversation>")

FAULT_KINDS = ("http_5xx", "http_429", "timeout", "truncated", "not_json")


def conversation_of(request: dict[str, Any]) -> str:
    text = "\n".join(str(m.get("content", "")) for m in request.get("messages", []))
    found = _CONVERSATION.search(text)
    return found.group(1) if found else ""


def fact_text(marker: str, call: int) -> str:
    return f"The user's code word is {marker} (noted by model call {call})"


def answer_for(markers: list[str], call: int) -> str:
    facts = tuple(
        NewFact(content=fact_text(marker, call), category="context", confidence=0.95)
        for marker in markers
    )
    return update_text(UpdateAnswer(new_facts=facts))


@dataclass
class ModelProfile:
    """Latency and faults. ``slow_seconds`` should exceed the lease (a run that must renew it),
    ``timeout_seconds`` the client's timeout."""

    fault_rate: float = 0.10
    slow_rate: float = 0.02
    slow_seconds: tuple[float, float] = (7.0, 9.0)
    timeout_seconds: float = 12.0
    retry_after_seconds: int = 1


@dataclass
class SoakModel:
    """The responder of a :class:`memq.testing.openai_server.ScriptedOpenAI`; thread-safe."""

    profile: ModelProfile = field(default_factory=ModelProfile)
    seed: int = 0
    outcomes: Counter[str] = field(default_factory=Counter)

    def __post_init__(self) -> None:
        self._rng = random.Random(self.seed)
        self._lock = threading.Lock()
        self._calls = 0

    def latency(self) -> float:
        """Most calls 50-500 ms (log-normal around ~150 ms); a tail beyond one lease."""
        with self._lock:
            if self._rng.random() < self.profile.slow_rate:
                return self._rng.uniform(*self.profile.slow_seconds)
            return min(max(self._rng.lognormvariate(-1.9, 0.6), 0.05), 2.0)

    def __call__(self, request: dict[str, Any]) -> Reply:
        with self._lock:
            self._calls += 1
            call = self._calls
            roll = self._rng.random()
            kind = self._rng.choice(FAULT_KINDS) if roll < self.profile.fault_rate else "ok"
        delay = self.latency()
        with self._lock:
            self.outcomes[kind] += 1
        if kind == "http_5xx":
            return Reply(status=503, delay_seconds=delay)
        if kind == "http_429":
            headers = {"Retry-After": str(self.profile.retry_after_seconds)}
            return Reply(status=429, headers=headers, delay_seconds=delay)
        if kind == "timeout":
            return Reply(content="{}", delay_seconds=self.profile.timeout_seconds)
        markers = sorted(set(MARKER.findall(conversation_of(request))))
        text = answer_for(markers, call)
        if kind == "truncated":
            return Reply(content=text[: max(1, len(text) // 2)], delay_seconds=delay)
        if kind == "not_json":
            return Reply(content="I'm sorry, I can't help with that.", delay_seconds=delay)
        with self._lock:
            self.outcomes["facts"] += len(markers)
        return Reply(content=text, delay_seconds=delay)

    @property
    def calls(self) -> int:
        with self._lock:
            return self._calls
