"""Which ``response_format`` an extraction asks the endpoint for, and what one endpoint was found
to accept.

The answer's JSON schema comes from the answer model (:func:`prompts.answer.answer_json_schema`),
so a constrained decoder can only write what the reader accepts. Endpoints differ: OpenAI, vLLM,
Ollama and llama.cpp's own server take OpenAI's structured outputs (``json_schema``);
llama-cpp-python's server refuses that type with a 500 but takes its own
``{"type": "json_object", "schema": …}`` and then follows the schema; some take only JSON mode,
a few nothing. With the ``auto`` setting the first request of a process asks for the most
constraining form and each refusal that names ``response_format`` (400, 422 or 500) steps down
one form, for the rest of the process: an endpoint costs at most one refused, unbilled request per
form it does not take, never a paid attempt per extraction. The synchronous call and the batch
lane's request lines both send :meth:`FormatChoice.current`.
"""

from __future__ import annotations

import json
import logging
import threading
from typing import Any, Literal, get_args

from memq.core.settings import LLMResponseFormat
from prompts.answer import answer_json_schema

log = logging.getLogger(__name__)

# What memq can send, most constraining first; ``auto`` starts at the first one.
Form = Literal["json_schema", "json_object_schema", "json_object", "none"]
FORMS: tuple[Form, ...] = get_args(Form)
SCHEMA_NAME = "memory_update"  # structured outputs' name of the schema: [a-zA-Z0-9_-]{1,64}
# Statuses an endpoint answers a response_format it does not take with (llama-cpp-python: 500).
_REFUSAL_STATUS = frozenset({400, 422, 500})


def response_format(form: Form) -> dict[str, Any] | None:
    """The ``response_format`` of a request in ``form`` (None: the field is not sent)."""
    if form == "json_schema":
        schema = {"name": SCHEMA_NAME, "schema": answer_json_schema(), "strict": True}
        return {"type": "json_schema", "json_schema": schema}
    if form == "json_object_schema":
        return {"type": "json_object", "schema": answer_json_schema()}
    if form == "json_object":
        return {"type": "json_object"}
    return None


def refuses_response_format(exc: BaseException) -> bool:
    """The endpoint refused the request because of its ``response_format``: a 400, 422 or 500
    (an ``openai.APIStatusError``, read by its fields: this module never loads the SDK, the
    ticker imports it) whose error names the field."""
    if getattr(exc, "status_code", None) not in _REFUSAL_STATUS:
        return False
    said = f"{exc} {json.dumps(getattr(exc, 'body', None), default=str)}".lower()
    return "response_format" in said


class FormatChoice:
    """What one endpoint is asked for, learnt once per process: shared by the synchronous calls
    and the batch lane's request lines, safe across threads."""

    def __init__(self, setting: LLMResponseFormat) -> None:
        self._setting = setting
        self._form: Form = "json_schema" if setting == "auto" else setting
        self._lock = threading.Lock()

    @property
    def form(self) -> Form:
        return self._form

    def current(self) -> dict[str, Any] | None:
        return response_format(self._form)

    def refused(self, sent: Form, exc: BaseException) -> bool:
        """Whether to send the request again at once, in the form now current: the endpoint
        refused ``sent`` and the setting is ``auto`` (the next form is remembered for the rest of
        the process; a thread that was refused the same form meanwhile does not step again)."""
        if self._setting != "auto" or not refuses_response_format(exc):
            return False
        with self._lock:
            if self._form == sent and sent != "none":
                self._form = FORMS[FORMS.index(sent) + 1]
                log.warning(
                    "the LLM endpoint refuses response_format %s (HTTP %s); asking for %s from "
                    "now on",
                    sent,
                    getattr(exc, "status_code", "?"),
                    self._form,
                )
            return self._form != sent
