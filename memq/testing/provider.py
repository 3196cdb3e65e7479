"""Provider behaviours for the scripted OpenAI-compatible server: prefix caching, rate limits and
flex refusals, each written from OpenAI's documentation so a test proves what a real endpoint does.

- **Prompt caching** (platform.openai.com/docs/guides/prompt-caching): prompts of 1,024 tokens or
  more are cached automatically; a request's ``usage.prompt_tokens_details.cached_tokens`` is the
  longest prefix it shares with an earlier request, counted in steps of 128 tokens from 1,024
  (1,024, 1,152, 1,280, ...). Requests are routed to a cache machine by their first ~256 tokens
  and ``prompt_cache_key``; past ~15 requests per minute for one such pair the excess overflows to
  other machines; caches are evicted after a few minutes of inactivity (the retention window).
- **Rate limits** (docs/guides/rate-limits): requests and tokens per minute, with the
  ``x-ratelimit-limit-*``, ``x-ratelimit-remaining-*`` and ``x-ratelimit-reset-*`` headers on every
  reply; over either, a 429 ``rate_limit_exceeded`` with ``Retry-After``. The bucket refills
  continuously ("reset" is the time until it is full again); limits may be enforced over shorter
  periods than a minute (60,000 RPM as 1,000 per second): ``burst_seconds`` is that period.
  Tokens counted against the limit are the prompt's plus ``max_tokens`` (or the scripted
  completion when none is asked).
- **Flex processing** (docs/guides/flex-processing): ``service_tier: "flex"`` may be refused with
  a 429 ``resource_unavailable`` when capacity is short; the reply says the tier it was served at.
- **Response formats** (docs/guides/structured-outputs): a model without structured outputs
  refuses ``response_format`` type ``json_schema`` with a 400 ``invalid_request_error`` whose
  ``param`` is ``response_format``; llama-cpp-python's server answers the same type with a 500
  (its request validation takes only ``text`` and ``json_object``, the latter with an optional
  ``schema``). :class:`ResponseFormats` refuses the types it is told to, either way.

:class:`Provider` bundles them; :class:`memq.testing.openai_server.ScriptedOpenAI` asks it to admit
each request and to finish each reply. Pure logic with an injectable clock, no HTTP in here.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

CACHE_MIN_TOKENS = 1024
CACHE_STEP_TOKENS = 128
DEFAULT_RETENTION_SECONDS = 300.0  # "typically 5-10 minutes of inactivity"
ROUTING_TOKENS = 256  # requests are routed by a hash of the prompt's first ~256 tokens

Clock = Callable[[], float]
Tokenizer = Callable[[str], list[int]]


def cached_tokens_for(shared_prefix: int) -> int:
    """Cached tokens for a shared prefix of ``shared_prefix`` tokens: 0 below 1,024, else the
    largest 1,024 + k*128 not past it."""
    if shared_prefix < CACHE_MIN_TOKENS:
        return 0
    return CACHE_MIN_TOKENS + (shared_prefix - CACHE_MIN_TOKENS) // CACHE_STEP_TOKENS * (
        CACHE_STEP_TOKENS
    )


def common_prefix(a: list[int], b: list[int]) -> int:
    n = min(len(a), len(b))
    for i in range(n):
        if a[i] != b[i]:
            return i
    return n


def default_tokenizer() -> Tokenizer:
    """cl100k (the offline encoding) when it loads, else one token per 4 characters."""
    from prompts.tokens import load_encoding

    encoding = load_encoding()
    if encoding is not None:
        return lambda text: list(encoding.encode(text, disallowed_special=()))
    return lambda text: [hash(text[i : i + 4]) for i in range(0, len(text), 4)]


def prompt_text(request: dict[str, Any]) -> str:
    """What the cache and the token count see: the messages in order, roles marked."""
    parts = []
    for message in request.get("messages") or []:
        if isinstance(message, dict):
            content = message.get("content", "")
            text = content if isinstance(content, str) else json.dumps(content)
            parts.append(f"<|{message.get('role', '')}|>{text}")
    return "".join(parts)


@dataclass
class PrefixCache:
    """Remembers the prompts seen per cache machine and answers how much of a new one was cached.

    Routing, as documented: a request goes to the machine of (its first ``ROUTING_TOKENS`` tokens,
    its ``prompt_cache_key``); past about ``overflow_rpm`` requests per minute for one such pair,
    the excess overflows to other machines (round robin over ``machines``), which have not seen
    its prefix. Each machine only serves prefixes it saw within the retention window.
    """

    retention_seconds: float = DEFAULT_RETENTION_SECONDS
    max_entries_per_machine: int = 64
    overflow_rpm: float | None = 15.0
    machines: int = 4
    clock: Clock = time.monotonic
    # (routing key, machine) -> [(tokens, last used)]
    _entries: dict[tuple[str, int], list[tuple[list[int], float]]] = field(default_factory=dict)
    # routing key -> arrival times in the last minute
    _arrivals: dict[str, list[float]] = field(default_factory=dict)

    def _machine(self, route: str, now: float) -> int:
        recent = [t for t in self._arrivals.get(route, []) if now - t < 60.0]
        recent.append(now)
        self._arrivals[route] = recent
        if self.overflow_rpm is None or len(recent) <= self.overflow_rpm:
            return 0
        return len(recent) % self.machines

    def lookup_and_store(self, key: str, tokens: list[int]) -> int:
        now = self.clock()
        route = f"{key}\x1f{hash(tuple(tokens[:ROUTING_TOKENS]))}"
        place = (route, self._machine(route, now))
        live = [e for e in self._entries.get(place, []) if now - e[1] <= self.retention_seconds]
        best, best_index = 0, -1
        for index, (seen, _) in enumerate(live):
            shared = common_prefix(seen, tokens)
            if shared > best:
                best, best_index = shared, index
        cached = cached_tokens_for(best)
        if cached and best_index >= 0:
            live[best_index] = (live[best_index][0], now)  # a hit keeps the entry warm
        if len(tokens) >= CACHE_MIN_TOKENS:
            live.append((tokens, now))
        self._entries[place] = live[-self.max_entries_per_machine :]
        return min(cached, len(tokens))


def reset_text(seconds: float) -> str:
    """OpenAI's reset format: ``1s``, ``6m0s``, ``20ms``."""
    if seconds < 1:
        return f"{max(0, round(seconds * 1000))}ms"
    minutes, rest = divmod(seconds, 60)
    return f"{int(minutes)}m{rest:.0f}s" if minutes else f"{rest:.3g}s"


@dataclass
class Bucket:
    """A continuously refilling bucket: ``limit`` per minute, holding ``limit * burst/60``."""

    limit_per_minute: float
    burst_seconds: float
    level: float = -1.0
    updated: float = 0.0

    @property
    def capacity(self) -> float:
        return max(1.0, self.limit_per_minute * self.burst_seconds / 60.0)

    @property
    def rate_per_second(self) -> float:
        return self.limit_per_minute / 60.0

    def refill(self, now: float) -> None:
        if self.level < 0:
            self.level, self.updated = self.capacity, now
            return
        self.level = min(self.capacity, self.level + (now - self.updated) * self.rate_per_second)
        self.updated = now

    def wait_for(self, amount: float) -> float:
        """Seconds until ``amount`` fits (0 when it does now)."""
        missing = min(amount, self.capacity) - self.level
        return 0.0 if missing <= 0 else missing / self.rate_per_second

    def seconds_to_full(self) -> float:
        return (self.capacity - self.level) / self.rate_per_second


@dataclass
class RateLimits:
    """Requests and tokens per minute (None: unlimited), enforced like the provider does."""

    requests_per_minute: float | None = None
    tokens_per_minute: float | None = None
    burst_seconds: float = 60.0
    clock: Clock = time.monotonic
    refused: int = 0
    _buckets: dict[str, Bucket] = field(default_factory=dict)

    def __post_init__(self) -> None:
        for name, limit in (
            ("requests", self.requests_per_minute),
            ("tokens", self.tokens_per_minute),
        ):
            if limit is not None:
                self._buckets[name] = Bucket(limit, self.burst_seconds)

    def admit(self, tokens: int, now: float | None = None) -> tuple[bool, float, dict[str, str]]:
        """(admitted, retry-after seconds, headers) for a request costing ``tokens`` that
        arrived at ``now`` (default: the clock now)."""
        now = self.clock() if now is None else now
        cost = {"requests": 1.0, "tokens": float(tokens)}
        waits = {}
        for name, bucket in self._buckets.items():
            bucket.refill(now)
            waits[name] = bucket.wait_for(cost[name])
        admitted = all(wait == 0 for wait in waits.values())
        if admitted:
            for name, bucket in self._buckets.items():
                bucket.level -= min(cost[name], bucket.capacity)
        else:
            self.refused += 1
        headers: dict[str, str] = {}
        for name, bucket in self._buckets.items():
            headers[f"x-ratelimit-limit-{name}"] = f"{bucket.limit_per_minute:g}"
            headers[f"x-ratelimit-remaining-{name}"] = str(max(0, int(bucket.level)))
            headers[f"x-ratelimit-reset-{name}"] = reset_text(bucket.seconds_to_full())
        return admitted, max(waits.values(), default=0.0), headers


@dataclass
class FlexCapacity:
    """Refuses the first ``refuse`` flex requests (then serves them), as a busy flex pool does."""

    refuse: int = 0
    refused: int = 0

    def admit(self) -> bool:
        if self.refused < self.refuse:
            self.refused += 1
            return False
        return True


@dataclass(frozen=True)
class Refusal:
    status: int
    body: dict[str, Any]
    headers: dict[str, str]


@dataclass
class ResponseFormats:
    """Refuses requests whose ``response_format`` type is in ``refuse``: as OpenAI refuses
    ``json_schema`` for a model without structured outputs (``status`` 400), or as
    llama-cpp-python's server does (``status`` 500). ``refused`` counts the refusals."""

    refuse: tuple[str, ...] = ("json_schema",)
    status: int = 400
    refused: int = 0

    def admit(self, request: dict[str, Any]) -> Refusal | None:
        asked = request.get("response_format")
        kind = asked.get("type") if isinstance(asked, dict) else None
        if kind not in self.refuse:
            return None
        self.refused += 1
        if self.status == 400:
            message = (
                f"Invalid parameter: 'response_format' of type '{kind}' is not supported with "
                "this model."
            )
            body = {
                "error": {
                    "message": message,
                    "type": "invalid_request_error",
                    "param": "response_format",
                    "code": None,
                }
            }
        else:
            body = _LLAMA_CPP_PYTHON_REFUSAL
        return Refusal(self.status, body, {})


@dataclass
class Provider:
    """The behaviours a scripted endpoint plays; each one off until configured."""

    cache: PrefixCache | None = None
    limits: RateLimits | None = None
    flex: FlexCapacity | None = None
    formats: ResponseFormats | None = None
    tokenizer: Tokenizer | None = None
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __post_init__(self) -> None:
        if self.tokenizer is None and (self.cache is not None or self.limits is not None):
            # Loaded now: a first request must not stall the ones behind it while it loads.
            self.tokenizer = default_tokenizer()

    def _tokens(self, request: dict[str, Any]) -> list[int]:
        if self.tokenizer is None:
            self.tokenizer = default_tokenizer()
        return self.tokenizer(prompt_text(request))

    def admit(
        self, request: dict[str, Any], completion_tokens: int
    ) -> tuple[Refusal | None, dict[str, str]]:
        """A refusal to send instead of the reply (None: served), and headers for either."""
        with self.lock:
            headers: dict[str, str] = {}
            # The request's body is checked before it is admitted to the limits.
            refused = None if self.formats is None else self.formats.admit(request)
            if refused is not None:
                return refused, headers
            if self.limits is not None:
                arrived = self.limits.clock()  # before counting: counting takes time too
                asked = request.get("max_tokens") or request.get("max_completion_tokens")
                cost = len(self._tokens(request)) + int(asked or completion_tokens)
                ok, wait, headers = self.limits.admit(cost, arrived)
                if not ok:
                    retry = {"retry-after": f"{max(1, round(wait + 0.4999))}"}
                    retry["retry-after-ms"] = str(max(1, round(wait * 1000)))
                    body = _error("rate_limit_exceeded", "Rate limit reached")
                    return Refusal(429, body, {**headers, **retry}), headers
            flex = self.flex if request.get("service_tier") == "flex" else None
            if flex is not None and not flex.admit():
                body = _error("resource_unavailable", "Flex capacity is unavailable")
                return Refusal(429, body, headers), headers
            return None, headers

    def finish(self, request: dict[str, Any], body: dict[str, Any]) -> None:
        """Rewrite a completion's usage as the provider would bill it (prompt counted, cached)."""
        if self.cache is None and self.limits is None:
            return
        with self.lock:
            tokens = self._tokens(request)
            usage = body.setdefault("usage", {})
            usage["prompt_tokens"] = len(tokens)
            usage["total_tokens"] = len(tokens) + int(usage.get("completion_tokens") or 0)
            if self.cache is not None:
                key = str(request.get("prompt_cache_key") or "")
                cached = self.cache.lookup_and_store(key, tokens)
                usage["prompt_tokens_details"] = {"cached_tokens": cached}
            tier = request.get("service_tier")
            body["service_tier"] = tier if tier in ("flex", "priority") else "default"


# llama-cpp-python 0.3.36's answer to a `json_schema` response_format, as measured against its
# server (its route handler turns the request's validation error into a 500; the traceback line
# it also quotes is left out).
_LLAMA_CPP_PYTHON_REFUSAL: dict[str, Any] = {
    "error": {
        "message": (
            "1 validation error:\n  {'type': 'literal_error', 'loc': ('body', 'response_format', "
            "'type'), 'msg': \"Input should be 'text' or 'json_object'\", 'input': 'json_schema', "
            "'ctx': {'expected': \"'text' or 'json_object'\"}}"
        ),
        "type": "internal_server_error",
        "param": None,
        "code": None,
    }
}


def _error(code: str, message: str) -> dict[str, Any]:
    return {"error": {"message": message, "type": "requests", "code": code}}
