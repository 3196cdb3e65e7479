"""A provider's Batch API as the batch lane uses it: upload a JSONL of requests and create a job,
ask for its status, read its output and error files, cancel it.

:class:`OpenAIBatchEndpoint` speaks OpenAI's files and batches endpoints through the `openai` SDK
(any compatible endpoint that offers them). SDK errors are mapped to ours with the same rule as
the synchronous client, so their messages stay free of conversation text.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Protocol

import openai

from memq.core.settings import MemqSettings
from worker.batch_jobs import CHAT_COMPLETIONS
from worker.batch_queue import BATCH_HTTP_TIMEOUT_SECONDS
from worker.llm import classify

_PLACEHOLDER_KEY = "not-needed"


@dataclass(frozen=True, slots=True)
class JobStatus:
    status: str
    input_file_id: str | None = None
    output_file_id: str | None = None
    error_file_id: str | None = None


class BatchEndpoint(Protocol):
    def create(self, lines: bytes, *, metadata: dict[str, str]) -> str: ...
    def status(self, batch_id: str) -> JobStatus: ...
    def content(self, file_id: str) -> str: ...
    def cancel(self, batch_id: str) -> None: ...
    def delete_file(self, file_id: str) -> None: ...


class OpenAIBatchEndpoint:
    def __init__(self, settings: MemqSettings, client: openai.OpenAI | None = None) -> None:
        key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else None
        self._client = client or openai.OpenAI(
            api_key=key or _PLACEHOLDER_KEY,
            base_url=settings.llm_base_url,
            timeout=BATCH_HTTP_TIMEOUT_SECONDS,
            max_retries=0,  # the next cycle is the retry; the shard's lock bounds a cycle
        )
        self._window = settings.llm_batch_completion_window

    def create(self, lines: bytes, *, metadata: dict[str, str]) -> str:
        """Upload ``lines`` (purpose ``batch``) and create a job on it; the job's id."""
        try:
            uploaded = self._client.files.create(
                file=("memq-batch.jsonl", lines, "application/jsonl"), purpose="batch"
            )
            job = self._client.batches.create(
                input_file_id=uploaded.id,
                endpoint=CHAT_COMPLETIONS,
                completion_window=self._window,  # type: ignore[arg-type]
                metadata=metadata,
            )
        except openai.OpenAIError as exc:
            raise classify(exc) from exc
        return job.id

    def status(self, batch_id: str) -> JobStatus:
        try:
            job = self._client.batches.retrieve(batch_id)
        except openai.OpenAIError as exc:
            raise classify(exc) from exc
        return JobStatus(job.status, job.input_file_id, job.output_file_id, job.error_file_id)

    def content(self, file_id: str) -> str:
        try:
            return self._client.files.content(file_id).text
        except openai.OpenAIError as exc:
            raise classify(exc) from exc

    def cancel(self, batch_id: str) -> None:
        try:
            self._client.batches.cancel(batch_id)
        except openai.OpenAIError as exc:
            raise classify(exc) from exc

    def delete_file(self, file_id: str) -> None:
        try:
            self._client.files.delete(file_id)
        except openai.OpenAIError as exc:
            raise classify(exc) from exc

    def close(self) -> None:
        self._client.close()
