"""The files and batches endpoints of the scripted OpenAI-compatible server, as OpenAI documents
them (the Batch API guide and the files/batches API reference).

- ``POST /v1/files`` (multipart: ``file``, ``purpose``) stores a file; ``GET /v1/files/{id}``
  describes it, ``GET /v1/files/{id}/content`` returns its bytes, ``DELETE /v1/files/{id}``
  deletes it.
- ``POST /v1/batches`` (``input_file_id``, ``endpoint``, ``completion_window`` — only ``24h`` is
  accepted — and ``metadata``) creates a job in ``validating``; the first ``GET /v1/batches/{id}``
  validates its input (every line JSON with a unique ``custom_id``, ``method`` POST and the job's
  ``url``; else the job is ``failed`` with ``errors``) and moves it to ``in_progress``.
- The test decides when a job ends: :meth:`ScriptedBatches.complete` (``completed``: every request
  answered with the server's normal scripted replies — its queue, else its responder — a 200 in
  the output file, any other status in the error file), :meth:`expire` (``expired``: the first
  ``answered`` requests in the output file, the rest in the error file with ``batch_expired``),
  :meth:`fail` (``failed``, no files), :meth:`cancel`. ``POST /v1/batches/{id}/cancel`` (and
  :meth:`cancel`) moves a job to ``cancelling``, then ``cancelled`` on the next read. With
  ``auto_complete`` a job completes on the first read after it started.
- An answer's usage is the server's provider's, as for a synchronous reply: with a prefix cache
  configured, the prompt is counted and its cached prefix reported
  (``prompt_tokens_details.cached_tokens``) — OpenAI applies prompt caching to batch requests on
  its current models, and bills the cached part at the batch price of cached input.
- ``request_counts`` (total, completed, failed) follow the files.
"""

from __future__ import annotations

import email.parser
import email.policy
import json
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Any, Protocol

from memq.testing.provider import Provider
from memq.testing.replies import Reply, completion_body


class ScriptedServer(Protocol):
    """What a batch job needs of the scripted server: its replies and its provider's books."""

    provider: Provider

    def reply_for(self, body: dict[str, Any]) -> Reply: ...


WINDOWS = frozenset({"24h"})
ENDPOINTS = frozenset(
    {"/v1/chat/completions", "/v1/responses", "/v1/embeddings", "/v1/completions"}
)
Response = tuple[int, bytes, str]  # status, body, content type


@dataclass
class StoredFile:
    id: str
    filename: str
    purpose: str
    data: bytes
    created_at: int = field(default_factory=lambda: int(time.time()))

    def describe(self) -> dict[str, Any]:
        return {
            "id": self.id,
            "object": "file",
            "bytes": len(self.data),
            "created_at": self.created_at,
            "filename": self.filename,
            "purpose": self.purpose,
            "status": "processed",
        }


@dataclass
class Job:
    id: str
    input_file_id: str
    endpoint: str
    completion_window: str
    metadata: dict[str, str]
    status: str = "validating"
    created_at: int = field(default_factory=lambda: int(time.time()))
    times: dict[str, int] = field(default_factory=dict)
    output_file_id: str | None = None
    error_file_id: str | None = None
    errors: dict[str, Any] | None = None
    lines: list[dict[str, Any]] = field(default_factory=list)
    counts: dict[str, int] = field(
        default_factory=lambda: {"total": 0, "completed": 0, "failed": 0}
    )

    def describe(self) -> dict[str, Any]:
        body: dict[str, Any] = {
            "id": self.id,
            "object": "batch",
            "endpoint": self.endpoint,
            "errors": self.errors,
            "input_file_id": self.input_file_id,
            "completion_window": self.completion_window,
            "status": self.status,
            "output_file_id": self.output_file_id,
            "error_file_id": self.error_file_id,
            "created_at": self.created_at,
            "expires_at": self.created_at + 86_400,
            "request_counts": dict(self.counts),
            "metadata": self.metadata,
        }
        for name in ("in_progress", "finalizing", "completed", "failed", "expired"):
            body[f"{name}_at"] = self.times.get(name)
        for name in ("cancelling", "cancelled"):
            body[f"{name}_at"] = self.times.get(name)
        return body


def _json(status: int, body: Any) -> Response:
    return status, json.dumps(body).encode(), "application/json"


def _error(status: int, message: str, code: str = "invalid_request_error") -> Response:
    return _json(status, {"error": {"message": message, "type": code, "param": None, "code": None}})


class ScriptedBatches:
    """Files and batch jobs held in memory by one scripted server."""

    def __init__(self, server: ScriptedServer) -> None:
        self._server = server
        self._lock = threading.Lock()
        self.files: dict[str, StoredFile] = {}
        self.jobs: dict[str, Job] = {}
        self.auto_complete = False
        self.answered: list[dict[str, Any]] = []  # every request body a job answered

    @staticmethod
    def serves(path: str) -> bool:
        return path.startswith(("/v1/files", "/v1/batches"))

    # --- HTTP
    def get(self, path: str) -> Response:
        parts = path.split("?", 1)[0].strip("/").split("/")
        with self._lock:
            if parts[:2] == ["v1", "files"] and len(parts) == 4 and parts[3] == "content":
                found = self.files.get(parts[2])
                if found is None:
                    return _error(404, "No such File object")
                return 200, found.data, "application/octet-stream"
            if parts[:2] == ["v1", "files"] and len(parts) == 3:
                found = self.files.get(parts[2])
                return _json(200, found.describe()) if found else _error(404, "No such File object")
            if parts[:2] == ["v1", "batches"] and len(parts) == 3:
                job = self.jobs.get(parts[2])
                if job is None:
                    return _error(404, "No such batch")
                self._advance(job)
                return _json(200, job.describe())
        return _error(404, "not found")

    def delete(self, path: str) -> Response:
        """``DELETE /v1/files/{id}``: the file is gone (its jobs keep their ids)."""
        parts = path.split("?", 1)[0].strip("/").split("/")
        with self._lock:
            if parts[:2] == ["v1", "files"] and len(parts) == 3 and parts[2] in self.files:
                del self.files[parts[2]]
                return _json(200, {"id": parts[2], "object": "file", "deleted": True})
        return _error(404, "No such File object")

    def post(self, path: str, content_type: str, raw: bytes) -> Response:
        parts = path.split("?", 1)[0].strip("/").split("/")
        with self._lock:
            if parts == ["v1", "files"]:
                return self._upload(content_type, raw)
            if parts == ["v1", "batches"]:
                return self._create(raw)
            if parts[:2] == ["v1", "batches"] and len(parts) == 4 and parts[3] == "cancel":
                job = self.jobs.get(parts[2])
                if job is None:
                    return _error(404, "No such batch")
                if job.status in ("validating", "in_progress", "finalizing"):
                    job.status = "cancelling"
                    job.times["cancelling"] = int(time.time())
                return _json(200, job.describe())
        return _error(404, "not found")

    def _upload(self, content_type: str, raw: bytes) -> Response:
        header = f"Content-Type: {content_type}\r\n\r\n".encode()
        message = email.parser.BytesParser(policy=email.policy.HTTP).parsebytes(header + raw)
        if not message.is_multipart():
            return _error(400, "expected multipart/form-data")
        fields: dict[str, tuple[str | None, bytes]] = {}
        for part in message.iter_parts():
            name = part.get_param("name", header="content-disposition")
            payload = part.get_payload(decode=True)
            if isinstance(name, str) and isinstance(payload, bytes):
                fields[name] = (part.get_filename(), payload)
        if "file" not in fields or "purpose" not in fields:
            return _error(400, "file and purpose are required")
        purpose = fields["purpose"][1].decode("utf-8", "replace")
        stored = StoredFile(
            f"file-{uuid.uuid4().hex[:24]}",
            fields["file"][0] or "upload",
            purpose,
            fields["file"][1],
        )
        self.files[stored.id] = stored
        return _json(200, stored.describe())

    def _create(self, raw: bytes) -> Response:
        try:
            body = json.loads(raw or b"{}")
        except ValueError:
            return _error(400, "body is not JSON")
        source = self.files.get(str(body.get("input_file_id")))
        if source is None or source.purpose != "batch":
            return _error(400, "input_file_id must name a file uploaded with purpose batch")
        if body.get("endpoint") not in ENDPOINTS:
            return _error(400, "unsupported endpoint")
        if body.get("completion_window") not in WINDOWS:
            return _error(400, "completion_window must be 24h")
        job = Job(
            f"batch_{uuid.uuid4().hex[:24]}",
            source.id,
            str(body["endpoint"]),
            str(body["completion_window"]),
            {str(k): str(v) for k, v in (body.get("metadata") or {}).items()},
        )
        self.jobs[job.id] = job
        return _json(200, job.describe())

    # --- the job's life
    def _advance(self, job: Job) -> None:
        now = int(time.time())
        if job.status == "validating":
            lines, problem = self._validate(job)
            if problem:
                job.status, job.errors = "failed", {"object": "list", "data": [problem]}
                job.times["failed"] = now
                return
            job.lines = lines
            job.counts["total"] = len(lines)
            job.status = "in_progress"
            job.times["in_progress"] = now
        elif job.status == "cancelling":
            job.status = "cancelled"
            job.times["cancelled"] = now
        elif job.status == "in_progress" and self.auto_complete:
            self._finish(job, "completed", len(job.lines))

    def _validate(self, job: Job) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
        lines: list[dict[str, Any]] = []
        seen: set[str] = set()
        text = self.files[job.input_file_id].data.decode("utf-8", "replace")
        for number, raw in enumerate(text.splitlines(), start=1):
            if not raw.strip():
                continue
            try:
                line = json.loads(raw)
            except ValueError:
                return [], {"code": "invalid_json_line", "line": number, "message": "not JSON"}
            custom = line.get("custom_id") if isinstance(line, dict) else None
            if not isinstance(custom, str) or custom in seen:
                return [], {"code": "duplicate_custom_id", "line": number, "message": "custom_id"}
            if line.get("method") != "POST" or line.get("url") != job.endpoint:
                return [], {"code": "invalid_url", "line": number, "message": "url or method"}
            seen.add(custom)
            lines.append(line)
        if not lines:
            return [], {"code": "empty_file", "line": None, "message": "no requests"}
        return lines, None

    def _finish(self, job: Job, status: str, answered: int) -> None:
        output: list[str] = []
        errors: list[str] = []
        for index, line in enumerate(job.lines):
            request_id = f"req_{uuid.uuid4().hex[:16]}"
            base = {"id": f"batch_req_{uuid.uuid4().hex[:16]}", "custom_id": line["custom_id"]}
            if index >= answered:
                error = {"code": "batch_expired", "message": "not run before the window ended"}
                errors.append(json.dumps({**base, "response": None, "error": error}))
                continue
            body = line.get("body") or {}
            reply = self._server.reply_for(body)
            self.answered.append(body)
            if reply.status == 200 and reply.body is None:
                answer = completion_body(reply, str(body.get("model", "scripted")))
                # Counted and prefix-cached by the provider as a synchronous call is.
                self._server.provider.finish(body, answer)
                response = {"status_code": 200, "request_id": request_id, "body": answer}
                output.append(json.dumps({**base, "response": response, "error": None}))
            else:
                failed = reply.body or {"error": {"message": f"scripted {reply.status}"}}
                response = {"status_code": reply.status, "request_id": request_id, "body": failed}
                errors.append(json.dumps({**base, "response": response, "error": None}))
        job.counts = {"total": len(job.lines), "completed": len(output), "failed": len(errors)}
        if output:
            job.output_file_id = self._store_output(job, output, "output")
        if errors:
            job.error_file_id = self._store_output(job, errors, "error")
        job.status = status
        job.times["finalizing"] = job.times[status] = int(time.time())

    def _store_output(self, job: Job, lines: list[str], kind: str) -> str:
        stored = StoredFile(
            f"file-{uuid.uuid4().hex[:24]}",
            f"{job.id}_{kind}.jsonl",
            "batch_output",
            ("\n".join(lines) + "\n").encode(),
        )
        self.files[stored.id] = stored
        return stored.id

    # --- what a test calls
    def _targets(self, batch_id: str | None) -> list[Job]:
        for job in self.jobs.values():
            if job.status == "validating":
                self._advance(job)
        return [
            job
            for job in self.jobs.values()
            if job.status == "in_progress" and (batch_id is None or job.id == batch_id)
        ]

    def complete(self, batch_id: str | None = None) -> int:
        """End the job (every job in progress when None) as ``completed``; how many ended."""
        with self._lock:
            jobs = self._targets(batch_id)
            for job in jobs:
                self._finish(job, "completed", len(job.lines))
            return len(jobs)

    def expire(self, batch_id: str | None = None, *, answered: int = 0) -> int:
        """End as ``expired``, with the first ``answered`` requests of each job done."""
        with self._lock:
            jobs = self._targets(batch_id)
            for job in jobs:
                self._finish(job, "expired", min(answered, len(job.lines)))
            return len(jobs)

    def fail(self, batch_id: str | None = None) -> int:
        """End as ``failed`` (no output or error file)."""
        with self._lock:
            jobs = self._targets(batch_id)
            for job in jobs:
                job.status = "failed"
                job.errors = {"object": "list", "data": [{"code": "scripted", "message": "failed"}]}
                job.times["failed"] = int(time.time())
            return len(jobs)

    def cancel(self, batch_id: str | None = None) -> int:
        """Cancel as someone else would (the dashboard): ``cancelling``, then ``cancelled``."""
        with self._lock:
            jobs = self._targets(batch_id)
            for job in jobs:
                job.status = "cancelling"
                job.times["cancelling"] = int(time.time())
            return len(jobs)

    def requests_of(self, status: str | None = None) -> list[dict[str, Any]]:
        """The request lines of every job (in ``status`` when given), in creation order."""
        with self._lock:
            for job in self.jobs.values():
                if job.status == "validating":
                    self._advance(job)
            return [
                line
                for job in self.jobs.values()
                if status is None or job.status == status
                for line in job.lines
            ]
