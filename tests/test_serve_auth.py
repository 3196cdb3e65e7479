"""Keys, scopes and user-id prefixes over the whole route table of a real `memq serve`.

The sweep walks the app's own route table, so a route added later is swept too: it fails here
unless it declares the one `Authorize` dependency and that dependency refuses a key bound to
``app1-`` on ``app2-x``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from typing import Any

import httpx
import pytest
from fastapi.routing import APIRoute
from starlette.routing import Mount, Route

from memq.core.settings import MemqSettings
from memq.local.redis_server import RedisServer
from memq.server import create_app
from memq.server.auth import Authorize, Keyring, check_bind
from memq.server.mcp_tools import KeyGuard
from memq.testing.serve_proc import ServeProcess
from storage import get_storage
from tests.support.serve import Keys, bearer, module_server

pytestmark = [pytest.mark.integration]

# Served without a key on purpose: the route table's own description.
PUBLIC_DOCUMENTS = {"/openapi.json"}
_PARAM = re.compile(r"\{(\w+)(?::\w+)?\}")


def _routes() -> list[tuple[str, str, bool]]:
    """(method, path, public) of every API route of the app, read from its own table."""
    app = create_app(MemqSettings(), mcp=False)
    out = []
    for route in app.routes:
        if isinstance(route, APIRoute):
            # A route without `Authorize` is swept as keyed: it must answer 403 like the rest.
            public = any(auth.operation is None for auth in _authorizations(route))
            out += [(m, route.path, public) for m in sorted(route.methods)]
    return out


def _authorizations(route: APIRoute) -> list[Authorize]:
    found: list[Authorize] = []
    stack = list(route.dependant.dependencies)
    while stack:
        dep = stack.pop()
        if isinstance(dep.call, Authorize):
            found.append(dep.call)
        stack += dep.dependencies
    return found


def test_every_route_declares_exactly_one_authorize_dependency() -> None:
    app = create_app(MemqSettings())
    checked = 0
    for route in app.routes:
        if isinstance(route, APIRoute):
            assert len(_authorizations(route)) == 1, f"{route.path} lacks Depends(Authorize(...))"
            checked += 1
        elif isinstance(route, Route) and route.path == "/mcp":
            assert isinstance(route.endpoint, KeyGuard), "/mcp is not behind the key guard"
        elif isinstance(route, Mount) and route.path == "/ui":
            continue  # the inspector: session login, its own table swept in test_ui_http.py
        else:
            assert getattr(route, "path", None) in PUBLIC_DOCUMENTS, f"unchecked route {route}"
    assert checked >= 15


@pytest.fixture(scope="module")
def server(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServeProcess, MemqSettings]]:
    with module_server(redis_server, tmp_path_factory.mktemp("serve-auth")) as served:
        yield served


def _request(method: str, path: str, user: str) -> tuple[str, str, dict[str, Any] | None]:
    values = {"user_id": user, "fact_id": "fact_00000000"}
    url = _PARAM.sub(lambda m: values.get(m.group(1), "x"), path)
    body = {} if method in {"POST", "PUT", "PATCH"} else None
    return method, url, body


@pytest.mark.parametrize(("method", "path", "public"), _routes(), ids=lambda v: str(v))
def test_a_key_bound_to_app1_is_refused_on_app2_for_every_route(
    server: tuple[ServeProcess, MemqSettings], method: str, path: str, public: bool
) -> None:
    proc, settings = server
    keys = Keys()
    method, url, body = _request(method, path, "app2-x")
    with httpx.Client(base_url=proc.url, timeout=10) as http:
        for key in (keys.app1_admin, keys.app1_agent):
            answer = http.request(method, url, json=body, headers=bearer(key))
            if public:
                assert answer.status_code != 403
                continue
            assert answer.status_code == 403, f"{method} {url}: {answer.status_code} {answer.text}"
            assert answer.headers["content-type"] == "application/problem+json"
        if public or "{user_id" not in path:
            return
        # The same request inside its prefix passes the check (whatever the route then says):
        # the 403 above is the prefix, not something else about the request.
        method, url, body = _request(method, path, "app1-x")
        inside = http.request(method, url, json=body, headers=bearer(keys.app1_admin))
        assert inside.status_code != 403, f"{method} {url}: {inside.text}"
    assert get_storage(settings).list_agents("app2-x") == []  # nothing of app2-x was written


def test_an_agent_key_cannot_forget_or_manage(server: tuple[ServeProcess, MemqSettings]) -> None:
    proc, settings = server
    keys = Keys()
    storage = get_storage(settings)
    with httpx.Client(base_url=proc.url, timeout=10) as http:
        added = http.post(
            "/v1/users/bob/facts",
            json={"content": "Bob plays the oboe", "category": "knowledge"},
            headers=bearer(keys.admin),
        )
        assert added.status_code == 201, added.text
        for method, url in (
            ("DELETE", "/v1/users/bob"),
            ("DELETE", f"/v1/users/bob/facts/{added.json()['id']}"),
            ("GET", "/v1/dead-letters"),
        ):
            refused = http.request(method, url, headers=bearer(keys.agent))
            assert refused.status_code == 403, refused.text
            assert "'admin' scope" in refused.json()["detail"]
        # Still there: the agent key changed nothing.
        assert [f.content for f in storage.load("bob", None).facts] == ["Bob plays the oboe"]
        forgot = http.delete("/v1/users/bob", headers=bearer(keys.admin))
        assert forgot.status_code == 200 and forgot.json()["removed"]["documents"] == 1
    assert storage.list_agents("bob") == []


def test_the_mcp_endpoint_wants_the_same_keys_and_prefixes(
    server: tuple[ServeProcess, MemqSettings],
) -> None:
    proc, _ = server
    keys = Keys()
    ping = {"jsonrpc": "2.0", "id": 1, "method": "ping"}
    accept = {"Accept": "application/json, text/event-stream"}
    with httpx.Client(base_url=proc.url, timeout=10) as http:
        assert http.post("/mcp", json=ping, headers=accept).status_code == 401
        app2 = {**accept, **bearer(keys.app1_agent), "X-Memq-User": "app2-x"}
        assert http.post("/mcp", json=ping, headers=app2).status_code == 403
        for bad in ("a%01b", "%E2%80%AEevil", "%FF"):  # a control, a bidi override, not UTF-8
            bad_user = {**accept, **bearer(keys.agent), "X-Memq-User": bad}
            assert http.post("/mcp", json=ping, headers=bad_user).status_code == 422, bad
        real = {**accept, **bearer(keys.agent), "X-Memq-User": "auth0%7Cabc"}
        assert http.post("/mcp", json=ping, headers=real).status_code == 200


def test_a_non_loopback_bind_without_keys_is_refused() -> None:
    from memq.core.errors import ConfigError

    check_bind("127.0.0.1", Keyring())
    check_bind("::1", Keyring())
    with pytest.raises(ConfigError, match=r"refusing to bind 0\.0\.0\.0 without API keys"):
        check_bind("0.0.0.0", Keyring())
    check_bind(
        "0.0.0.0", Keyring.from_entries([{"name": "k", "key": "x" * 20, "scopes": ["agent"]}])
    )
