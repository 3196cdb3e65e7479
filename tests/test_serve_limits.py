"""Hostile and oversize requests to a real `memq serve`: 413 or 422 with one problem+json line,
never a 500, and nothing written to the queue or the memory."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from typing import Any

import httpx
import pytest

from memq.core.settings import MemqSettings
from memq.local.redis_server import RedisServer
from memq.operations.caps import MAX_DEAD_IDS
from memq.testing.serve_proc import ServeProcess
from storage import get_storage
from tests.support.serve import Keys, bearer, module_server
from worker.queue import QueueClient

pytestmark = [pytest.mark.integration]

PROBLEM = "application/problem+json"
MAX_BODY = 50_000
MAX_MESSAGES = 20


@pytest.fixture(scope="module")
def server(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServeProcess, MemqSettings]]:
    tmp = tmp_path_factory.mktemp("serve-limits")
    limits = {"serve_max_body_bytes": MAX_BODY, "producer_max_messages": MAX_MESSAGES}
    with module_server(redis_server, tmp, **limits) as served:
        yield served


@pytest.fixture
def served(
    server: tuple[ServeProcess, MemqSettings],
) -> Iterator[tuple[ServeProcess, MemqSettings, httpx.Client]]:
    proc, settings = server
    with httpx.Client(base_url=proc.url, timeout=10, headers=bearer(Keys().admin)) as http:
        yield proc, settings, http


def nothing_written(settings: MemqSettings, redis_client: Any, user: str = "alice") -> bool:
    """No queued context and no memory for ``user`` (other tests of the module use others)."""
    queued = list(redis_client.scan_iter(match=f"{settings.key_prefix}*:{user}:*", count=1000))
    return not queued and get_storage(settings).list_agents(user) == []


def _turns(count: int, text: str = "I like tea.") -> list[dict[str, str]]:
    roles = ("user", "assistant")
    return [{"role": roles[i % 2], "content": text} for i in range(count)]


def test_a_body_above_the_cap_is_413_before_it_is_read(
    served: tuple[ServeProcess, MemqSettings, httpx.Client], redis_client: Any
) -> None:
    _, settings, http = served
    body = {"thread_id": "t", "messages": _turns(2, "x" * (MAX_BODY * 2))}
    answer = http.post("/v1/users/alice/conversations", json=body)
    assert answer.status_code == 413
    assert answer.headers["content-type"] == PROBLEM
    assert "MEMQ_SERVE_MAX_BODY_BYTES" in answer.json()["detail"]
    assert nothing_written(settings, redis_client)


def test_a_chunked_body_without_a_length_is_cut_off_at_the_cap(
    served: tuple[ServeProcess, MemqSettings, httpx.Client], redis_client: Any
) -> None:
    _, settings, http = served
    payload = json.dumps({"thread_id": "t", "messages": _turns(2, "y" * MAX_BODY * 3)}).encode()

    def chunks() -> Iterator[bytes]:
        for start in range(0, len(payload), 8192):
            yield payload[start : start + 8192]

    answer = http.post(
        "/v1/users/alice/conversations",
        content=chunks(),
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 413
    assert answer.headers["content-type"] == PROBLEM
    assert nothing_written(settings, redis_client)


def test_too_many_messages_is_413(
    served: tuple[ServeProcess, MemqSettings, httpx.Client], redis_client: Any
) -> None:
    _, settings, http = served
    answer = http.post(
        "/v1/users/alice/conversations",
        json={"thread_id": "t", "messages": _turns(MAX_MESSAGES + 1)},
    )
    assert answer.status_code == 413
    assert (
        answer.json()["detail"]
        == f"{MAX_MESSAGES + 1} messages; at most {MAX_MESSAGES} per request"
    )
    assert nothing_written(settings, redis_client)


def test_too_many_dead_letter_ids_is_413_and_nothing_retried(
    served: tuple[ServeProcess, MemqSettings, httpx.Client],
) -> None:
    # The cap is the operation's own (memq.operations.caps), not the hand-off's message cap.
    _, _, http = served
    ids = [f"ctx-{n}" for n in range(MAX_DEAD_IDS + 1)]
    for verb in ("retry", "purge"):
        answer = http.post(f"/v1/dead-letters/{verb}", json={"ids": ids})
        assert answer.status_code == 413, verb
        assert answer.json()["detail"] == (
            f"{MAX_DEAD_IDS + 1} ids; at most {MAX_DEAD_IDS} per request"
        )
    # At the cap the call is taken (none of these ids is a dead letter: 0 moved).
    assert http.post("/v1/dead-letters/retry", json={"ids": ids[:-1]}).json() == {"count": 0}


MALFORMED: list[tuple[str, bytes]] = [
    ("not json", b"{this is not json"),
    ("unclosed", b'{"thread_id": "t", "messages": [{"role": "user"'),
    ("a list", b"[1, 2, 3]"),
    ("messages not a list", b'{"thread_id": "t", "messages": "hello"}'),
    ("no thread", b'{"messages": []}'),
    ("unknown field", b'{"thread_id": "t", "messages": [], "evil": 1}'),
    ("deeply nested", b'{"thread_id": "t", "messages": [' + b"[" * 12_000 + b"]" * 12_000 + b"]}"),
    (
        "nested objects",
        b'{"thread_id": "t", "messages": ' + b'{"a":' * 5_000 + b"1" + b"}" * 5_000 + b"}",
    ),
    (
        "trace id too long",
        b'{"thread_id": "t", "trace_id": "' + b"x" * 5000 + b'", "messages": [{"role": "user", '
        b'"content": "I like tea."}, {"role": "assistant", "content": "ok"}]}',
    ),
    ("control chars in thread", b'{"thread_id": "a\\u0000b", "messages": []}'),
    (
        "role not text",
        b'{"thread_id": "t", "messages": [{"role": 7, "content": "x"}, '
        b'{"role": "assistant", "content": "ok"}]}',
    ),
]


@pytest.mark.parametrize(("what", "raw"), MALFORMED, ids=[m[0] for m in MALFORMED])
def test_a_malformed_body_is_422_with_one_line_and_writes_nothing(
    served: tuple[ServeProcess, MemqSettings, httpx.Client],
    redis_client: Any,
    what: str,
    raw: bytes,
) -> None:
    server, settings, http = served
    answer = http.post(
        "/v1/users/alice/conversations",  # alice: no test of this module writes for her
        content=raw,
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 422, (what, answer.status_code, answer.text)
    assert answer.headers["content-type"] == PROBLEM
    detail = answer.json()["detail"]
    assert detail and "\n" not in detail
    assert nothing_written(settings, redis_client)
    assert "Traceback" not in server.log_text()


@pytest.mark.parametrize(
    "user",
    ["x" * 300, "a%00b", "%E2%80%AEevil", "%20"],
    ids=["too long", "nul", "bidi override", "blank"],
)
def test_a_user_id_memq_cannot_store_is_422(
    served: tuple[ServeProcess, MemqSettings, httpx.Client], redis_client: Any, user: str
) -> None:
    _, settings, http = served
    queue = QueueClient(settings, redis_client)
    before = queue.stats()["due"]
    answer = http.post(
        f"/v1/users/{user}/conversations", json={"thread_id": "t", "messages": _turns(2)}
    )
    assert answer.status_code in (404, 422), answer.text  # `..` never reaches a route
    assert answer.headers["content-type"] == PROBLEM
    assert queue.stats()["due"] == before


def test_a_large_message_with_control_and_format_characters_is_accepted(
    served: tuple[ServeProcess, MemqSettings, httpx.Client], redis_client: Any
) -> None:
    _, _, http = served
    user = "zed"
    text = "I like tea. \ud800 \x07 \u202e" * 500  # ~20 kB escaped, under the body cap
    body = {"thread_id": "t-1", "messages": _turns(2, text), "flush": True}
    answer = http.post(
        f"/v1/users/{user}/conversations",
        # ASCII-escaped, so the lone surrogate travels as `\\ud800` (as a JS client sends it).
        content=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    assert answer.status_code == 202, answer.text
    assert answer.json()["status"] == "queued"


def test_a_slow_client_does_not_hold_other_requests(
    served: tuple[ServeProcess, MemqSettings, httpx.Client],
) -> None:
    server, _, http = served
    # A client that sends half a body and stalls: the others are still answered.
    with socket.create_connection(("127.0.0.1", server.port), timeout=5) as stalled:
        stalled.sendall(
            b"POST /v1/users/alice/conversations HTTP/1.1\r\nHost: x\r\n"
            b'Content-Type: application/json\r\nContent-Length: 1000\r\n\r\n{"thread'
        )
        assert http.get("/healthz").status_code == 200
        assert http.get("/v1/users/alice/memory").status_code == 200


@pytest.mark.parametrize("agent", ["x" * 300, "a\x01b", "\u202e", " "])
def test_a_read_with_an_agent_name_memq_cannot_store_is_422(
    served: tuple[ServeProcess, MemqSettings, httpx.Client], agent: str
) -> None:
    _, _, http = served
    answer = http.get("/v1/users/alice/memory", params={"agent_name": agent})
    assert answer.status_code == 422, answer.text
    assert answer.headers["content-type"] == PROBLEM
    assert "agent_name" in answer.json()["detail"]


def test_real_ids_with_separators_are_accepted_over_http(
    served: tuple[ServeProcess, MemqSettings, httpx.Client],
) -> None:
    _, _, http = served
    body = {"thread_id": "t/1", "agent_name": "team/bot", "messages": _turns(2), "flush": True}
    answer = http.post("/v1/users/auth0%7Cabc/conversations", json=body)
    assert answer.status_code == 202, answer.text
    assert answer.json()["status"] == "queued"
    memory = http.get("/v1/users/alice@example.com/memory", params={"agent_name": "a/b"})
    assert memory.status_code == 200
    # A user id with a slash is one user when encoded as one segment; unencoded, the slash
    # separates segments and reaches no user (never another one).
    added = http.post("/v1/users/org%2Fana/facts", json={"content": "Ana runs the org"})
    assert added.status_code == 201, added.text
    facts = http.get("/v1/users/org%2Fana/facts").json()["facts"]
    assert [f["content"] for f in facts] == ["Ana runs the org"]
    assert http.get("/v1/users/org/ana/facts").status_code == 404
