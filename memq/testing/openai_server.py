"""A scripted OpenAI-compatible HTTP server on loopback for tests and benchmarks.

The real `openai` client talks HTTP to it. Each request is recorded; the reply comes from a queue of
scripted :class:`Reply` objects, else from ``responder(request_json)``.
"""

from __future__ import annotations

import contextlib
import json
import re
import sys
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any, Literal

from memq.memory.update import NewFact, UpdateAnswer
from memq.testing.embeddings import ScriptedEmbeddings
from memq.testing.openai_batches import ScriptedBatches
from memq.testing.provider import Provider
from memq.testing.relative_dates import message_days, resolve_relative
from memq.testing.replies import Reply, completion_body
from memq.testing.waiting import DEADLINE_SECONDS


def update_text(answer: UpdateAnswer) -> str:
    """An update answer as a model would send it, written by the one answer model."""
    return json.dumps(answer.to_wire(), ensure_ascii=False)


EMPTY_UPDATE = update_text(UpdateAnswer())

# A new message of the update prompt: "[m1] User: …" (continuation lines are indented).
_LABELLED = re.compile(r"^\[(m\d+)\] (User|Assistant): (.*(?:\n    .*)*)", re.MULTILINE)


def slot_body(text: str, tag: str) -> str | None:
    """The body of the prompt's ``<tag>`` slot (its lines between the opening and closing tag),
    found by two linear scans: no lazy pattern to rescan the rest for an unclosed opener."""
    opener, closer = f"<{tag}>\n", f"\n</{tag}>"
    start = text.find(opener)
    if start < 0:
        return None
    end = text.find(closer, start + len(opener))
    return text[start + len(opener) : end] if end >= 0 else None


def request_text(request: dict[str, Any]) -> str:
    return "\n".join(str(m.get("content", "")) for m in request.get("messages", []))


def labelled_messages(request: dict[str, Any]) -> list[tuple[str, str, str]]:
    """(label, role, text) of each new message of an update prompt, as the model sees them."""
    return [
        (label, role.lower(), text)
        for label, role, text in _LABELLED.findall(request_text(request))
    ]


def memory_facts(request: dict[str, Any]) -> list[dict[str, Any]]:
    """The facts of the ``<current_memory>`` slot (id, content, …)."""
    found = slot_body(request_text(request), "current_memory")
    if found is None:
        return []
    facts = json.loads(found).get("facts", [])
    return [f for f in facts if isinstance(f, dict)]


@dataclass(frozen=True)
class Teach:
    """One fact a :class:`CitingModel` learns when a new message holds ``said``: cited
    ``right`` (the labels of those messages), ``wrong`` (a label the prompt does not have) or
    ``none`` (no citation)."""

    content: str
    said: str
    role: str | None = None  # only messages of this role count ("user", "assistant")
    cite: Literal["right", "wrong", "none"] = "right"
    category: str = "context"
    confidence: float = 0.95


@dataclass
class CitingModel:
    """A responder that answers like a model that cites: the facts of ``teach`` whose phrase a
    new message holds, each with its citation, and ``factsToRemove`` naming every stored fact
    whose content holds one of ``contradicts``."""

    teach: list[Teach] = field(default_factory=list)
    contradicts: list[str] = field(default_factory=list)
    delay_seconds: float = 0.0
    release: threading.Event | None = None  # see Reply.release

    def __call__(self, request: dict[str, Any]) -> Reply:
        messages = labelled_messages(request)
        days = message_days(slot_body(request_text(request), "conversation") or "")
        facts = []
        for rule in self.teach:
            said = [
                (label, text)
                for label, role, text in messages
                if rule.said in text and (rule.role is None or role == rule.role)
            ]
            if not said:
                continue
            labels = tuple(label for label, _ in said)
            cites = {"right": labels, "wrong": ("m999",), "none": ()}[rule.cite]
            # As the prompt asks: a relative time in the message resolved against its day.
            label, text = said[0]
            event = resolve_relative(text, days[label]) if label in days else None
            facts.append(
                NewFact(
                    content=rule.content,
                    category=rule.category,
                    confidence=rule.confidence,
                    cites=cites,
                    event_date=None if event is None else event.isoformat(),
                )
            )
        removals = tuple(
            str(f["id"])
            for f in memory_facts(request)
            if any(old in str(f.get("content", "")) for old in self.contradicts)
        )
        answer = UpdateAnswer(new_facts=tuple(facts), facts_to_remove=removals if facts else ())
        return Reply(
            content=update_text(answer), delay_seconds=self.delay_seconds, release=self.release
        )


class _QuietServer(ThreadingHTTPServer):
    """A client that went away mid-request (a worker killed, a timeout) is not an error here."""

    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        if isinstance(sys.exc_info()[1], ConnectionError | TimeoutError):
            return
        super().handle_error(request, client_address)


class ScriptedOpenAI:
    def __init__(
        self,
        responder: Callable[[dict[str, Any]], Reply] | None = None,
        *,
        provider: Provider | None = None,
    ) -> None:
        # Prefix caching, rate limits, flex refusals (memq.testing.provider); off by default.
        self.provider = provider or Provider()
        self.responder = responder or (lambda request: Reply(content=EMPTY_UPDATE))
        self.replies: deque[Reply] = deque()
        self.requests: list[dict[str, Any]] = []
        self.request_times: list[float] = []
        self.lock = threading.Lock()
        self.auth_headers: list[str | None] = []
        self.refusals: list[int] = []  # the status of each request the provider refused
        self.refusal_times: list[float] = []  # and when (time.monotonic())
        self.batches = ScriptedBatches(self)  # the files + batches endpoints
        self.embeddings = ScriptedEmbeddings()  # /v1/embeddings (memq.testing.embeddings)
        server = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"
            # Headers and body go out in two writes: without this, Nagle + the client's delayed
            # ACK add ~40 ms to every reply (a scripted 200 ms LLM answered in 244 ms).
            disable_nagle_algorithm = True

            def log_message(self, format: str, *args: Any) -> None:
                return

            def do_GET(self) -> None:  # /v1/models, used by `memq doctor`
                if server.batches.serves(self.path):
                    status, payload, content_type = server.batches.get(self.path)
                    self._send(status, payload, {}, content_type)
                    return
                body = json.dumps(
                    {"object": "list", "data": [{"id": "scripted", "object": "model"}]}
                )
                self._send(200, body.encode(), {})

            def do_DELETE(self) -> None:  # /v1/files/{id}
                status, payload, content_type = server.batches.delete(self.path)
                self._send(status, payload, {}, content_type)

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                raw = self.rfile.read(length)
                if server.batches.serves(self.path):
                    status, payload, content_type = server.batches.post(
                        self.path, self.headers.get("Content-Type", ""), raw
                    )
                    self._send(status, payload, {}, content_type)
                    return
                try:
                    request = json.loads(raw or b"{}")
                except ValueError:
                    request = {}
                if self.path.rstrip("/").endswith("/embeddings"):
                    status, answer = server.embeddings.answer(request)
                    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                        self._send(status, json.dumps(answer).encode(), {})
                    return
                with server.lock:
                    server.requests.append(request)
                    server.request_times.append(time.monotonic())
                    server.auth_headers.append(self.headers.get("Authorization"))
                    scripted = server.replies[0] if server.replies else None
                    # A refused request does not use up the scripted reply.
                    refusal, limit_headers = server.provider.admit(
                        request, (scripted or Reply()).completion_tokens
                    )
                    if refusal is not None:
                        server.refusals.append(refusal.status)
                        server.refusal_times.append(server.request_times[-1])
                if refusal is not None:
                    with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                        self._send(
                            refusal.status, json.dumps(refusal.body).encode(), refusal.headers
                        )
                    return
                reply = server.reply_for(request)
                if reply.release is not None:
                    reply.release.wait(DEADLINE_SECONDS)
                if reply.delay_seconds:
                    time.sleep(reply.delay_seconds)  # wait-ok: a slow model, as scripted
                if isinstance(reply.body, bytes):
                    payload = reply.body
                elif reply.body is not None:
                    payload = json.dumps(reply.body).encode()
                elif reply.status == 200:
                    body = completion_body(reply, str(request.get("model", "scripted")))
                    server.provider.finish(request, body)
                    payload = json.dumps(body).encode()
                else:
                    payload = json.dumps(
                        {"error": {"message": f"scripted {reply.status}", "type": "scripted"}}
                    ).encode()
                # the client may have given up already (timeout tests)
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    self._send(reply.status, payload, {**limit_headers, **reply.headers})

            def _send(
                self,
                status: int,
                payload: bytes,
                headers: dict[str, str],
                content_type: str = "application/json",
            ) -> None:
                self.send_response(status)
                self.send_header("Content-Type", content_type)
                self.send_header("Content-Length", str(len(payload)))
                for name, value in headers.items():
                    self.send_header(name, value)
                self.end_headers()
                self.wfile.write(payload)

        self.httpd = _QuietServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(
            target=self.httpd.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
        )

    def reply_for(self, request: dict[str, Any]) -> Reply:
        """The next scripted reply, else the responder's for ``request`` (synchronous calls and
        batch jobs' requests alike)."""
        with self.lock:
            reply = self.replies.popleft() if self.replies else None
        return reply if reply is not None else self.responder(request)

    @property
    def port(self) -> int:
        return int(self.httpd.server_address[1])

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self) -> ScriptedOpenAI:
        self.thread.start()
        return self

    def stop(self) -> None:
        self.embeddings.release()  # a hung embeddings request must not hold the shutdown
        self.httpd.shutdown()
        self.httpd.server_close()

    def script(self, *replies: Reply) -> None:
        with self.lock:
            self.replies.extend(replies)

    @property
    def call_count(self) -> int:
        with self.lock:
            return len(self.requests)

    def prompts(self) -> list[str]:
        """The text of every message of every request, joined per request."""
        with self.lock:
            return [
                "\n".join(str(m.get("content", "")) for m in r.get("messages", []))
                for r in self.requests
            ]
