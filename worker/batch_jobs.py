"""The batch lane's files, as pure functions: the JSONL a job uploads, and what its output and
error files say about each request.

A request's ``custom_id`` is ``memq-<claim token>``: tokens are unique within a shard and a job
holds one shard's contexts, so the id names the claim the answer belongs to (the job's record in
Redis maps it to the context). Output and error lines are read tolerantly: a line that does not
parse, or names no request of ours, is skipped, and a request no line answers goes back to a
synchronous run like one whose line is an error.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any, Final

from openai.types.chat import ChatCompletion
from pydantic import ValidationError

from worker.llm import answer_of
from worker.model import ModelAnswer

CHAT_COMPLETIONS: Final = "/v1/chat/completions"
_CUSTOM_ID_PREFIX = "memq-"
# The provider's states a job never leaves; `completed` and `expired` may carry answers.
FINISHED = frozenset({"completed", "failed", "expired", "cancelled"})


def custom_id(token: str) -> str:
    return f"{_CUSTOM_ID_PREFIX}{token}"


def token_of(custom: object) -> str | None:
    """The claim token a ``custom_id`` names; None for one memq did not write."""
    if not isinstance(custom, str) or not custom.startswith(_CUSTOM_ID_PREFIX):
        return None
    token = custom.removeprefix(_CUSTOM_ID_PREFIX)
    return token if token.isdigit() else None


def request_lines(requests: Iterable[tuple[str, str]]) -> bytes:
    """The job's input file: one line per (claim token, request body JSON)."""
    lines = []
    for token, body in requests:
        line = {
            "custom_id": custom_id(token),
            "method": "POST",
            "url": CHAT_COMPLETIONS,
            "body": json.loads(body),
        }
        lines.append(json.dumps(line, ensure_ascii=True, separators=(",", ":")))
    return ("\n".join(lines) + "\n").encode("ascii")


@dataclass(frozen=True, slots=True)
class RequestResult:
    """What one request of a job came to: an answer, or why there is none (content-free)."""

    answer: ModelAnswer | None
    error: str = ""


def read_results(text: str, model: str) -> dict[str, RequestResult]:
    """Claim token -> result, from an output or error file's JSONL."""
    results: dict[str, RequestResult] = {}
    for raw in text.splitlines():
        try:
            line = json.loads(raw)
        except (ValueError, RecursionError):  # RecursionError: nesting deeper than json allows
            continue
        if not isinstance(line, dict):
            continue
        token = token_of(line.get("custom_id"))
        if token is not None:
            results[token] = _result_of(line, model)
    return results


def _result_of(line: dict[str, Any], model: str) -> RequestResult:
    response = line.get("response")
    error = line.get("error")
    if isinstance(error, dict) and error:
        return RequestResult(None, f"request error {str(error.get('code', 'unknown'))[:64]}")
    if not isinstance(response, dict):
        return RequestResult(None, "no response")
    status = response.get("status_code")
    if status != 200:
        return RequestResult(None, f"request answered {str(status)[:8]}")
    try:
        completion = ChatCompletion.model_validate(response.get("body"))
    except ValidationError:
        return RequestResult(None, "unreadable response")
    return RequestResult(answer_of(completion, model))
