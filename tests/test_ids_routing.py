"""Every id reaches its own route. A property over generated user, thread and fact ids (with `/`,
`%`, dots, route-like endings) and every id route of the HTTP API and the inspector: the path a
client builds (each id percent-encoded as one segment) is routed, as uvicorn hands it over, to
that very route with exactly those ids. Then the cases that hit another target before, through a
real uvicorn: forgetting user `app1-bob/facts/F`, thread `slack/C1`, the inspector's page for
`x/memory`, and an MCP resource URI."""

from __future__ import annotations

import re
from typing import Any
from urllib.parse import unquote

import httpx
import pytest
from hypothesis import HealthCheck, given
from hypothesis import settings as hypothesis_settings
from hypothesis import strategies as st
from starlette.routing import BaseRoute, Match, Mount

from memq.core.settings import MemqSettings
from memq.server.app import create_app
from memq.server.ids import ID, path_segment, routing_path
from storage import get_storage
from storage.management import MemoryManager
from tests.support.serve import Keys, bearer

_PARAM = re.compile(r"\{(\w+):" + ID + r"\}")
_OTHER = re.compile(r"\{(\w+)\}")
APP = create_app(MemqSettings(), mcp=False)


def _id_routes(routes: list[BaseRoute], prefix: str = "") -> list[tuple[str, str, BaseRoute]]:
    out = []
    for route in routes:
        if isinstance(route, Mount):
            out += _id_routes(list(route.routes), prefix + route.path)
        elif _PARAM.search(getattr(route, "path", "")):
            for method in sorted(getattr(route, "methods", None) or {"GET"}):
                out.append((method, prefix + route.path, route))  # type: ignore[attr-defined]
    return out


ROUTES = _id_routes(list(APP.router.routes))
TRICKY = [
    "app1-bob/facts/F",
    "slack/C1",
    "x/memory",
    "a/threads/b",
    "u/",
    "/u",
    ".",
    "..",
    "a%2Fb",
    "100%",
    "%00anonymous-lookalike",
    "alice@example.com",
    "auth0|abc/../x",
    "j\u00fcrgen.m\u00fcller",
    "x/memory/../facts",
]
ids = st.one_of(
    st.sampled_from(TRICKY),
    st.text(
        st.characters(blacklist_categories=("Cc", "Cf", "Cs", "Co", "Cn", "Zl", "Zp")),
        min_size=1,
        max_size=30,
    ).filter(lambda s: s.strip() != ""),
)


def _resolve(method: str, raw_path: str) -> tuple[BaseRoute, dict[str, Any]]:
    """Route ``raw_path`` as the app does behind uvicorn (which hands over the raw path and its
    decoding), through mounts."""
    scope: dict[str, Any] = {
        "type": "http",
        "method": method,
        "path": unquote(raw_path),
        "raw_path": raw_path.encode("ascii"),
        "root_path": "",
    }
    if "%2f" in raw_path.lower():  # what RawPathRouting does in front of the router
        scope["path"] = routing_path(raw_path)
    routes = list(APP.router.routes)
    while True:
        for route in routes:
            match, child = route.matches(scope)
            if match == Match.FULL:
                break
        else:
            raise AssertionError(f"no route for {method} {raw_path}")
        scope = {**scope, **child}
        if not isinstance(route, Mount):
            return route, dict(child.get("path_params", {}))
        routes = list(route.routes)


def test_the_table_holds_every_id_route() -> None:
    paths = {path for _, path, _ in ROUTES}
    assert len(ROUTES) >= 20
    assert any(p.startswith("/ui/users/") for p in paths)
    assert "/v1/users/{user_id:memqid}/threads/{thread_id:memqid}" in paths


@hypothesis_settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(ROUTES), ids, ids, ids)
def test_every_id_reaches_its_own_route(
    route: tuple[str, str, BaseRoute], user: str, thread: str, fact: str
) -> None:
    method, template, expected = route
    values = {"user_id": user, "thread_id": thread, "fact_id": fact}
    raw = _PARAM.sub(lambda m: path_segment(values[m.group(1)]), template)
    # A parameter that is no id (a summary's section name) gets a plain word of its own.
    others = {name: "work_context" for name in _OTHER.findall(raw)}
    raw = _OTHER.sub(lambda m: others[m.group(1)], raw)
    routed, params = _resolve(method, raw)
    assert routed is expected, (method, raw, getattr(routed, "path", routed))
    assert params == {**{name: values[name] for name in _PARAM.findall(template)}, **others}


# --- through a real uvicorn
@pytest.mark.integration
def test_forgetting_ids_that_end_like_routes_reaches_exactly_them(
    settings: MemqSettings, serve_for: Any, ui_client: Any
) -> None:
    manager = MemoryManager(get_storage(settings))
    kept = manager.add_fact("app1-bob", "Bob keeps this")
    manager.add_fact("app1-bob/facts/" + kept.id, "The slash user")
    manager.add_fact("x", "I am x")
    manager.add_fact("x/memory", "I am x-slash-memory")
    server = serve_for(settings)
    admin = bearer(Keys().admin)
    with httpx.Client(base_url=server.url, headers=admin, timeout=30) as http:
        target = "app1-bob/facts/" + kept.id
        forgot = http.delete("/v1/users/" + path_segment(target))
        assert forgot.status_code == 200, forgot.text
        assert forgot.json()["user_id"] == target
        assert [f.content for f in manager.list_facts("app1-bob")] == ["Bob keeps this"]
        assert manager.list_facts(target) == []

        thread = http.delete("/v1/users/x/threads/" + path_segment("slack/C1"))
        assert thread.status_code == 200, thread.text
        assert (thread.json()["user_id"], thread.json()["thread_id"]) == ("x", "slack/C1")
        assert [f.content for f in manager.list_facts("x")] == ["I am x"]

        memory = http.get("/v1/users/" + path_segment("x/memory") + "/memory")
        assert [f["content"] for f in memory.json()["facts"]] == ["I am x-slash-memory"]

    ui = ui_client(server)
    ui.login(Keys().admin)
    page = ui.get("/users/" + path_segment("x/memory") + "/memory")
    assert page.status_code == 200
    assert "I am x-slash-memory" in page.text and "I am x<" not in page.text
