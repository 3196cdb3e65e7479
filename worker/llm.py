"""The update model: one call from a rendered prompt to the model's answer text and its token usage.

Two implementations of :class:`worker.model.UpdateModel`: :class:`OpenAIUpdateModel` (the
`openai` SDK, synchronous, against any OpenAI-compatible endpoint) and the offline rules extractor
(:mod:`worker.offline`). :func:`build_update_model` picks one from the settings; build it once per
process (a client holds a connection pool) and never at import.

Retries are ours, not the SDK's, so the outcome is explicit: transient failures (timeout, connection
error, 408/409/425/429, 5xx) are retried with exponential backoff up to ``llm_max_retries`` times,
honouring ``Retry-After``; a wait longer than ``max_inline_wait_seconds`` is not slept through but
raised at once as :class:`TransientLLMError` with ``retry_after_seconds``, so the queue reschedules
the context instead of a worker thread idling. Permanent failures (auth, bad request, not found) are
raised as :class:`PermanentLLMError` without a retry. The ``response_format`` asked for is the
endpoint's :class:`worker.response_format.FormatChoice`: with ``auto``, a refusal of the form sent
steps down to the next and sends again at once, without counting as an attempt.
"""

from __future__ import annotations

import email.utils
import logging
import math
import time
from collections.abc import Callable, Mapping
from typing import Any

import openai

from memq.core.errors import PermanentLLMError, TransientLLMError
from memq.core.settings import INLINE_RETRY_WAIT_SECONDS, MemqSettings
from prompts.answer import response_text
from prompts.tokens import TokenCounter
from prompts.update_prompt import UpdatePrompt
from worker.model import ModelAnswer, UpdateModel
from worker.response_format import FormatChoice, refuses_response_format

log = logging.getLogger(__name__)

_TRANSIENT_STATUS = frozenset({408, 409, 425, 429})
_PLACEHOLDER_KEY = "not-needed"  # local OpenAI-compatible servers often want no key at all


# Called once per HTTP request to the model: its result label and how long it took, in seconds.
RequestObserver = Callable[[str, float], None]
# Called with each reply's status, headers and Retry-After (seconds, if any): the rate limiter
# tightens its budget from them.
LimitObserver = Callable[[int, Mapping[str, str], float | None], None]


def request_result(exc: openai.OpenAIError | None) -> str:
    """A small, fixed set of labels for what one request to the model came to."""
    if exc is None:
        return "ok"
    if isinstance(exc, openai.APITimeoutError):
        return "timeout"
    if isinstance(exc, openai.APIConnectionError):
        return "unreachable"
    if isinstance(exc, openai.APIStatusError):
        if exc.status_code == 429:
            return "rate_limited"
        return "server_error" if exc.status_code >= 500 else "client_error"
    return "invalid_response"


def _no_observer(result: str, seconds: float) -> None:
    return None


def retry_after_seconds(response: Any) -> float | None:
    """``retry-after-ms`` or ``Retry-After`` (seconds or an HTTP date) of a response, if any."""
    headers = getattr(response, "headers", None)
    if headers is None:
        return None
    raw_ms = headers.get("retry-after-ms")
    if raw_ms:
        try:
            return max(0.0, float(raw_ms) / 1000.0)
        except ValueError:
            pass
    raw = headers.get("retry-after")
    if not raw:
        return None
    try:
        seconds = float(raw)
    except ValueError:
        pass
    else:
        return max(0.0, seconds) if math.isfinite(seconds) else None
    try:
        parsed = email.utils.parsedate_to_datetime(raw)
    except (TypeError, ValueError):  # neither seconds nor a date ("soon"): no hint, not a crash
        return None
    return max(0.0, parsed.timestamp() - time.time())


def classify(exc: openai.OpenAIError) -> TransientLLMError | PermanentLLMError:
    """Map an SDK error to ours. The message holds the error's type and HTTP status only: the
    server's text can echo the conversation (and pydantic's puts the input in its message), and
    this message is stored as the dead letter's reason, which Flower and `memq dead list` show.
    The server's text is logged at DEBUG for whoever debugs the endpoint."""
    log.debug("LLM endpoint error %s: %s", type(exc).__name__, exc)
    kind = type(exc).__name__
    if isinstance(exc, openai.APITimeoutError):
        return TransientLLMError(f"LLM call timed out ({kind})")
    if isinstance(exc, openai.APIConnectionError):
        return TransientLLMError(f"LLM endpoint unreachable ({kind})")
    if isinstance(exc, openai.APIStatusError):
        status = exc.status_code
        message = f"LLM endpoint answered {status} ({kind})"
        if status in _TRANSIENT_STATUS or status >= 500:
            return TransientLLMError(message, retry_after_seconds=retry_after_seconds(exc.response))
        return PermanentLLMError(message)
    if isinstance(exc, openai.APIResponseValidationError):
        return TransientLLMError(f"LLM endpoint sent an unreadable response ({kind})")
    return PermanentLLMError(f"LLM call failed ({kind})")


def _count(value: Any) -> int:
    """A token count from a usage field: a whole number >= 0, else 0 (a provider sent junk)."""
    try:
        return max(0, int(value or 0))
    except (TypeError, ValueError):
        return 0


def _rate_limited(exc: openai.OpenAIError) -> bool:
    """A 429 that says we send too fast (a refused flex call says the flex pool is busy)."""
    return (
        isinstance(exc, openai.APIStatusError)
        and exc.status_code == 429
        and exc.code != "resource_unavailable"
    )


def _fall_back(tier: str | None, allowed: bool, exc: openai.OpenAIError) -> bool:
    """A flex call refused until its retries ran out moves to the default tier, when allowed."""
    refused = isinstance(exc, openai.APIStatusError) and exc.status_code == 429
    return allowed and tier == "flex" and refused


# Fields of chat_request's body sent past the SDK's parameter transform (see _call).
_PLAIN_FIELDS = ("messages", "response_format")


def chat_request(
    prompt: UpdatePrompt,
    *,
    model: str,
    temperature: float,
    response_format: Mapping[str, Any] | None,
) -> dict[str, Any]:
    """The body of one extraction's chat completion request: what a synchronous call sends and
    what a batch job's request line carries (``response_format``: a FormatChoice's current)."""
    body: dict[str, Any] = {
        "model": model,
        "messages": prompt.chat_messages(),
        "temperature": temperature,
    }
    if response_format is not None:
        body["response_format"] = dict(response_format)
    return body


def answer_of(
    response: Any, model: str, *, attempts: int = 1, tier: str | None = None
) -> ModelAnswer:
    """The answer text and usage of a chat completion (the SDK's object, synchronous or parsed
    from a batch job's output line), cached prompt tokens and the serving tier included."""
    choice = response.choices[0] if response.choices else None
    usage = response.usage
    details = getattr(usage, "prompt_tokens_details", None)
    return ModelAnswer(
        text=response_text(choice.message.content if choice is not None else None),
        prompt_tokens=_count(getattr(usage, "prompt_tokens", 0)),
        completion_tokens=_count(getattr(usage, "completion_tokens", 0)),
        model=str(getattr(response, "model", None) or model),
        attempts=attempts,
        cached_tokens=_count(getattr(details, "cached_tokens", 0)),
        service_tier=str(getattr(response, "service_tier", None) or tier or ""),
    )


class OpenAIUpdateModel:
    """Chat completions with the response format, temperature and timeout from the settings."""

    def __init__(
        self,
        settings: MemqSettings,
        *,
        client: openai.OpenAI | None = None,
        formats: FormatChoice | None = None,
        sleep: Callable[[float], None] = time.sleep,
        backoff_base_seconds: float = 0.5,
        max_inline_wait_seconds: float = INLINE_RETRY_WAIT_SECONDS,
        observe: RequestObserver | None = None,
        on_limits: LimitObserver | None = None,
    ) -> None:
        key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else None
        self._client = client or openai.OpenAI(
            api_key=key or _PLACEHOLDER_KEY,
            base_url=settings.llm_base_url,
            timeout=settings.llm_timeout_seconds,
            max_retries=0,
        )
        self._model = settings.llm_model
        self._temperature = settings.llm_temperature
        self.formats = formats or FormatChoice(settings.llm_response_format)
        self._max_retries = settings.llm_max_retries
        self._backoff_max = settings.retry_backoff_max_seconds
        self._sleep = sleep
        self._backoff_base = backoff_base_seconds
        self._max_inline_wait = max_inline_wait_seconds
        self._observe = observe or _no_observer
        self._on_limits = on_limits
        # The SDK loads its resources on first use (a few hundred ms): done here, not between the
        # rate limiter's admission and the request reaching the provider.
        _ = self._client.chat.completions.with_raw_response
        self._send_cache_key = settings.llm_prompt_cache_key
        self._service_tier = settings.llm_service_tier
        self._flex_fallback = settings.llm_flex_fallback

    def _call(
        self,
        prompt: UpdatePrompt,
        cache_key: str | None,
        tier: str | None,
        form: Mapping[str, Any] | None,
    ) -> Any:
        body = chat_request(
            prompt, model=self._model, temperature=self._temperature, response_format=form
        )
        if cache_key and self._send_cache_key:
            body["prompt_cache_key"] = cache_key
        if tier:
            body["service_tier"] = tier
        # The SDK walks every parameter against its typed dicts before sending: ~0.3 ms of CPU
        # a message and ~0.25 ms for the schema on a 2-core host, 1.4 ms a call — more than the
        # rest of a run's work outside the call. The messages and the response format are plain
        # JSON already: they go as `extra_body`, which the SDK merges into the request body as
        # it is (the same JSON is sent); the scalars still take the typed path.
        plain = {field: body.pop(field) for field in _PLAIN_FIELDS if field in body}
        raw = self._client.chat.completions.with_raw_response.create(
            messages=[], **body, extra_body=plain
        )
        self._limits_seen(raw.status_code, raw.headers, None)
        return raw.parse()

    def _limits_seen(
        self, status: int, headers: Mapping[str, str], retry_after: float | None
    ) -> None:
        if self._on_limits is not None:
            self._on_limits(status, headers, retry_after)

    def _wait_before_retry(self, error: TransientLLMError, attempt: int) -> float:
        if error.retry_after_seconds is not None:
            return error.retry_after_seconds
        return float(min(self._backoff_base * (2**attempt), self._backoff_max))

    def propose(self, prompt: UpdatePrompt, *, cache_key: str | None = None) -> ModelAnswer:
        attempt = 0
        tier = self._service_tier
        while True:
            attempt += 1
            started = time.monotonic()
            form = self.formats.form
            try:
                response = self._call(prompt, cache_key, tier, self.formats.current())
                self._observe("ok", time.monotonic() - started)
                break
            except openai.OpenAIError as exc:
                self._observe(request_result(exc), time.monotonic() - started)
                if isinstance(exc, openai.APIStatusError) and exc.code != "resource_unavailable":
                    # (a refused flex call says the flex pool is busy, not that we send too fast)
                    self._limits_seen(
                        exc.status_code, exc.response.headers, retry_after_seconds(exc.response)
                    )
                if self.formats.refused(form, exc):
                    attempt -= 1  # refused unanswered and unbilled: not an attempt
                    continue
                if refuses_response_format(exc):
                    # The setting names one form and the endpoint will not take it: retrying
                    # the same request cannot help, and the operator must hear why.
                    raise PermanentLLMError(
                        f"the LLM endpoint refuses response_format {form} (HTTP "
                        f"{getattr(exc, 'status_code', '?')}); set MEMQ_LLM_RESPONSE_FORMAT=auto"
                    ) from exc
                error = classify(exc)
                if isinstance(error, PermanentLLMError):
                    raise error from exc
                if attempt > self._max_retries and _fall_back(tier, self._flex_fallback, exc):
                    log.warning("flex capacity refused %d times; trying the default tier", attempt)
                    tier = None
                    continue
                if self._on_limits is not None and _rate_limited(exc):
                    # A shared rate limit is in force: a retry sent from here would pass it by
                    # and take another run's slot. The queue retries the run instead.
                    raise error from exc
                if attempt > self._max_retries:
                    raise TransientLLMError(
                        f"{error} (gave up after {attempt} attempts)",
                        retry_after_seconds=error.retry_after_seconds,
                    ) from exc
                wait = self._wait_before_retry(error, attempt - 1)
                if wait > self._max_inline_wait:
                    # The queue waits that long; a worker thread should not.
                    raise TransientLLMError(str(error), retry_after_seconds=wait) from exc
                log.warning(
                    "LLM attempt %d/%d failed, retrying in %.2fs: %s",
                    attempt,
                    self._max_retries + 1,
                    wait,
                    error,
                )
                self._sleep(wait)
        return answer_of(response, self._model, attempts=attempt, tier=tier)

    def close(self) -> None:
        self._client.close()


def build_update_model(
    settings: MemqSettings,
    *,
    count_tokens: TokenCounter | None = None,
    observe: RequestObserver | None = None,
    on_limits: LimitObserver | None = None,
    formats: FormatChoice | None = None,
) -> UpdateModel:
    """The model the settings ask for: a real endpoint, or the offline rules when none is set.
    ``observe`` is told the result and duration of every request to a real endpoint,
    ``on_limits`` its status and rate-limit headers; ``formats`` is the process's choice of
    response format (the batch lane's request lines send the same)."""
    if settings.resolved_llm_provider == "rules":
        from worker.offline import RulesUpdateModel

        return RulesUpdateModel(count_tokens=count_tokens)
    log.info(
        "update model: %s at %s", settings.llm_model, settings.llm_base_url or "api.openai.com"
    )
    return OpenAIUpdateModel(settings, observe=observe, on_limits=on_limits, formats=formats)
