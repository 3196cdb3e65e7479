"""One rate limit to the model, shared by every worker process: requests and tokens per minute per
(endpoint, model), enforced atomically in Redis.

Why one Lua script and not a limiter library: a run must take a request *and* its tokens
together or neither (two separate limiters would spend a request slot on a call the token limit
then refuses), must learn *when* it would fit (the context goes back to `due` at that time instead
of a worker thread sleeping), and must honour a pause the provider asked for — none of the
maintained Redis-backed limiters (``limits``, ``pyrate-limiter``) offers the three in one atomic
step. The schedule is GCRA (``rate_acquire.lua``); ``rate_pause.lua`` records a provider's pause.

A run that does not fit reserves the next free slot (the schedule moves on as if it had called)
and goes back to `due` at that time, carrying the slot: when it comes back it calls without asking
again, so contexts waiting on the limit each get their own slot instead of all retrying at the same
instant, and a run that comes back a tick late loses nothing.

The limiter's burst is kept below the provider's by a tenth plus two ticks and a tenth of a
second (at least one request stays): that is how late a reserved run may reach the provider
(the ticker claims it on its next tick, then scheduling and the network), so slots never bunch
into a 429. The steady rate is the configured one. Redis unreachable: calls are admitted (the
limit fails open; the provider's own 429s still back the queue off).
"""

from __future__ import annotations

import hashlib
import logging
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from enum import Enum

import redis

from memq.core.clock import now_ms
from memq.core.connection import RedisClient
from memq.core.errors import RunDeferred
from memq.core.keys import KeySchema
from memq.core.scripts import register
from memq.core.settings import MemqSettings

log = logging.getLogger(__name__)

HEADROOM = 0.1  # share of the provider's burst kept free (see the module docstring)
LATE_MS = 100  # besides two ticks: how late a run may reach the provider after its slot
STALE_SLOT_MS = 60_000  # a slot this far in the past is not used: the run asks afresh
_RESET = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


class Admission(Enum):
    """rate_acquire.lua's return codes."""

    WAIT = 0
    ADMITTED = 1
    PAUSED = 2
    RESERVED = 3


@dataclass(frozen=True, slots=True)
class RatePlan:
    """The schedule's parameters, in milliseconds (0 per unit: that limit is off)."""

    request_ms: float
    request_burst_ms: float
    token_ms: float
    token_burst_ms: float

    @classmethod
    def from_settings(cls, settings: MemqSettings) -> RatePlan | None:
        """None when neither limit is set."""
        rpm, tpm = settings.llm_rate_limit_rpm, settings.llm_rate_limit_tpm
        if rpm is None and tpm is None:
            return None
        burst_ms = settings.llm_rate_limit_burst_seconds * 1000
        # The provider's bucket holds rpm * burst / 60 requests; ours less what lateness eats.
        ours_ms = burst_ms * (1 - HEADROOM) - 2 * settings.tick_seconds * 1000 - LATE_MS
        request_ms = token_ms = 0.0
        request_burst = token_burst = 0.0
        if rpm is not None:
            request_ms = 60_000 / rpm
            request_burst = max(request_ms, ours_ms)
        if tpm is not None:
            token_ms = 60_000 / tpm
            token_burst = max(token_ms, ours_ms)
        return cls(request_ms, request_burst, token_ms, token_burst)


def limit_scope(base_url: str | None, model: str) -> str:
    """An opaque name for one (endpoint, model): a URL may carry credentials, a hash does not."""
    material = f"{base_url or 'https://api.openai.com/v1'}\x1f{model}"
    return hashlib.sha256(material.encode("utf-8")).hexdigest()[:16]


def reset_seconds(text: str) -> float | None:
    """OpenAI's reset duration (``1s``, ``6m0s``, ``20ms``, ``1.5s``) in seconds; None if unread."""
    parts = _RESET.findall(text.strip())
    if not parts or "".join(n + u for n, u in parts) != text.strip():
        return None
    return sum(float(number) * _UNIT_SECONDS[unit] for number, unit in parts)


def pause_from_headers(
    status: int, headers: Mapping[str, str], retry_after_seconds: float | None
) -> float | None:
    """How long (seconds) the provider says to send nothing: a 429's Retry-After, else the time
    until one request or token frees up when it says none is left; None when it says nothing."""
    if status == 429:
        return retry_after_seconds if retry_after_seconds is not None else 1.0
    waits = []
    for kind in ("requests", "tokens"):
        remaining = headers.get(f"x-ratelimit-remaining-{kind}")
        if remaining is None or remaining.strip() != "0":
            continue
        reset = reset_seconds(headers.get(f"x-ratelimit-reset-{kind}", ""))
        if reset is None:
            continue
        try:
            limit = float(headers.get(f"x-ratelimit-limit-{kind}", "0"))
        except ValueError:
            limit = 0.0
        one_unit = 60 / limit if limit > 0 else reset
        waits.append(min(reset, one_unit))
    return max(waits) if waits else None


class SharedRateLimit:
    """The limiter the worker asks before each model call (see the module docstring)."""

    def __init__(
        self,
        plan: RatePlan,
        client: RedisClient,
        key: str,
        *,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self._plan = plan
        self._client = client
        self._key = key
        self._clock = clock
        self._acquire = register(client, "worker", "rate_acquire")
        self._pause = register(client, "worker", "rate_pause")

    @classmethod
    def for_settings(cls, settings: MemqSettings, client: RedisClient) -> SharedRateLimit | None:
        plan = RatePlan.from_settings(settings)
        if plan is None:
            return None
        scope = limit_scope(settings.llm_base_url, settings.llm_model)
        return cls(plan, client, KeySchema(settings.key_prefix, settings.shards).rate_limit(scope))

    def acquire(self, tokens: int, *, reserve: bool = False) -> tuple[Admission, int]:
        """Take one request and ``tokens`` now (ADMITTED), or say when they fit (WAIT; with
        ``reserve``, RESERVED: taken for that slot), or that the provider paused us (PAUSED);
        with the time (epoch ms) of the slot or the end of the pause."""
        now = self._clock()
        plan = self._plan
        try:
            code, at = self._acquire(
                keys=[self._key],
                args=[
                    now,
                    f"{plan.request_ms:.6f}",
                    f"{plan.request_burst_ms:.6f}",
                    f"{plan.token_ms:.9f}",
                    f"{plan.token_burst_ms:.6f}",
                    max(0, tokens),
                    "1" if reserve else "0",
                ],
            )
        except redis.RedisError as exc:
            log.warning("shared rate limit unreadable, admitting the call: %s", exc)
            return Admission.ADMITTED, now
        return Admission(int(code)), int(at)

    def gate_for(self, slot_ms: int | None) -> Callable[[int], None]:
        """The gate of one run: its call goes ahead now, or :class:`RunDeferred` sends the run
        back to `due` with the slot reserved for it. ``slot_ms``: the slot an earlier deferral of
        this context reserved (the call then goes ahead from that time without asking again)."""

        def gate(tokens: int) -> None:
            now = self._clock()
            if slot_ms is not None and now - slot_ms <= STALE_SLOT_MS:
                if now >= slot_ms:
                    return
                raise RunDeferred(
                    "LLM rate limit: run early for its reserved slot",
                    retry_at_ms=slot_ms,
                    reason="rate_limit",
                    slot_ms=slot_ms,
                )
            admission, at = self.acquire(tokens, reserve=True)
            if admission is Admission.ADMITTED:
                return
            raise RunDeferred(
                f"LLM rate limit reached; next free slot in {max(0, at - now)} ms",
                retry_at_ms=at,
                reason="rate_limit",
                slot_ms=at if admission is Admission.RESERVED else None,
            )

        return gate

    def pause(self, seconds: float) -> None:
        """Admit nothing for ``seconds`` (the provider said so); a longer pause in force stays."""
        now = self._clock()
        try:
            self._pause(keys=[self._key], args=[now + max(0, round(seconds * 1000)), now])
        except redis.RedisError as exc:
            log.warning("provider pause not recorded: %s", exc)

    def observe(
        self, status: int, headers: Mapping[str, str], retry_after_seconds: float | None
    ) -> None:
        """Tighten the budget from a reply's status and `x-ratelimit-*` headers."""
        wait = pause_from_headers(status, headers, retry_after_seconds)
        if wait is not None and wait > 0:
            self.pause(wait)
