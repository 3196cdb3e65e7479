"""The inspector over HTTP against a real `memq serve`: its route table, logins and scopes, CSRF
on every POST, the security headers, stored text escaped, the preview equal to what an agent
gets. The browser tests (test_ui_browser.py) drive the same pages in Chromium."""

from __future__ import annotations

import html
import re
import uuid
from collections.abc import Iterator
from html.parser import HTMLParser
from typing import Any

import httpx
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from starlette.routing import Match, Mount

from memq.core.settings import MemqSettings
from memq.local.redis_server import RedisServer
from memq.server import create_app
from memq.server.ids import routing_path
from memq.server.ui.access import Access
from memq.server.ui.render import CONTENT_SECURITY_POLICY, path_segment
from memq.testing.serve_proc import ServeProcess
from storage import get_storage
from storage.management import MemoryManager
from storage.sources import MAX_EXCERPT_CHARS, MAX_SOURCE_EXCERPTS
from tests.support.inspector import HOSTILE_FACTS, REAL_USER_IDS, UiClient
from tests.support.serve import Keys, bearer, module_server

pytestmark = [pytest.mark.integration]
_PARAM = re.compile(r"\{(\w+)(?::\w+)?\}")
# Served without a session on purpose: the login form and its POST (which checks the CSRF token
# of the login page's own session).
# Pages before a login: the login form, and the language switch it shows (a cookie, no memory).
LOGIN_PATHS = {"/login", "/lang/{code}"}


def inspector_app() -> FastAPI:
    app = create_app(MemqSettings(), mcp=False)
    (mount,) = [r for r in app.routes if isinstance(r, Mount) and r.path == "/ui"]
    assert isinstance(mount.app, FastAPI)
    return mount.app


def accesses(route: APIRoute) -> list[Access]:
    found: list[Access] = []
    stack = list(route.dependant.dependencies)
    while stack:
        dep = stack.pop()
        if isinstance(dep.call, Access):
            found.append(dep.call)
        stack += dep.dependencies
    return found


def ui_routes() -> list[tuple[str, str]]:
    return [
        (method, route.path)
        for route in inspector_app().routes
        if isinstance(route, APIRoute)
        for method in sorted(route.methods)
    ]


def test_every_inspector_route_declares_one_access_and_every_post_checks_csrf() -> None:
    checked = 0
    for route in inspector_app().routes:
        if isinstance(route, Mount):
            assert route.path == "/static", f"unchecked mount {route.path}"
            continue
        assert isinstance(route, APIRoute), f"unchecked route {route}"
        found = accesses(route)
        if route.path in LOGIN_PATHS:
            assert found == [], "the login form cannot need a login"
            continue
        assert len(found) == 1, f"{route.path} lacks Depends(Access(...))"
        if "POST" in route.methods:
            assert found[0].form, f"POST {route.path} does not check the CSRF token"
        checked += 1
    assert checked >= 12


@pytest.fixture(scope="module")
def ui_server(
    redis_server: RedisServer, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[ServeProcess, MemqSettings]]:
    """One `memq serve` for the module (each test uses its own users)."""
    with module_server(redis_server, tmp_path_factory.mktemp("ui-http")) as served:
        yield served


def _manager(settings: MemqSettings) -> MemoryManager:
    return MemoryManager(get_storage(settings), max_facts=settings.max_facts)


def _fill(path: str, user: str, fact_id: str) -> str:
    values = {"user_id": path_segment(user), "fact_id": fact_id}
    return _PARAM.sub(lambda m: values.get(m.group(1), "x"), path)


@pytest.mark.parametrize(("method", "path"), [r for r in ui_routes() if r[0] == "POST"])
def test_a_post_without_the_sessions_csrf_token_is_refused_and_changes_nothing(
    ui_server: tuple[Any, MemqSettings], ui_client: Any, method: str, path: str
) -> None:
    server, settings = ui_server
    manager = _manager(settings)
    user = f"app1-csrf/{uuid.uuid4().hex[:6]}@example.com"
    fact = manager.add_fact(user, "The user sails", confidence=0.8)
    before = (manager.export(user), manager.history(user))
    ui: UiClient = ui_client(server)
    assert ui.login(Keys().admin).status_code == 200
    url = _fill(path, user, fact.id)
    form = {
        "content": "changed",
        "confirm": user,
        "thread_id": "t-1",
        "context_id": "all",
        "key": Keys().admin,
        "query": "q",
        "budget": "200",
    }
    for token in (None, "", "not-the-token", ui.csrf[:-1]):
        body = form if token is None else {**form, "csrf_token": token}
        answer = ui.http.post(url, data=body)
        assert answer.status_code == 403, f"{url} with token {token!r}: {answer.status_code}"
        assert "CSRF" in answer.text
    assert (manager.export(user), manager.history(user)) == before
    # Another session's token is refused too: the token is per session.
    other: UiClient = UiClient(server.url)
    try:
        other.login(Keys().admin)
        answer = ui.http.post(url, data={**form, "csrf_token": other.csrf})
        assert answer.status_code == 403
    finally:
        other.close()
    assert (manager.export(user), manager.history(user)) == before


class Markup(HTMLParser):
    """Collects what a browser would build: elements, their attributes, and each stored-text
    span's text."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.texts: list[str] = []
        self._depth = 0
        self._buffer: list[str] = []

    def handle_starttag(self, tag: str, attrs: list[tuple[str, str | None]]) -> None:
        self.tags.append((tag, dict(attrs)))
        classes = (dict(attrs).get("class") or "").split()
        if self._depth:
            self._depth += 1
        elif tag == "span" and "ut" in classes:
            self._depth, self._buffer = 1, []

    def handle_endtag(self, tag: str) -> None:
        if self._depth:
            self._depth -= 1
            if not self._depth:
                self.texts.append("".join(self._buffer))

    def handle_data(self, data: str) -> None:
        if self._depth:
            self._buffer.append(data)


def error_of(page: str) -> str:
    """The one line an error page says."""
    found = re.search(r'id="error-message">([^<]*)<', page)
    return html.unescape(found.group(1)) if found else ""


def parsed(page: str) -> Markup:
    markup = Markup()
    markup.feed(page)
    return markup


def test_hostile_stored_text_is_text_on_every_page_under_a_strict_csp(
    ui_server: tuple[Any, MemqSettings], ui_client: Any
) -> None:
    server, settings = ui_server
    manager = _manager(settings)
    eve = "app1-eve|auth0/x@example.com"
    facts = [manager.add_fact(eve, text, confidence=0.7) for text in HOSTILE_FACTS]
    manager.add_fact(eve, HOSTILE_FACTS[0], agent_name="helper", category="goal")
    user = "/users/" + path_segment(eve)
    ui: UiClient = ui_client(server)
    ui.login(Keys().admin)
    pages = [
        "/users",
        user,
        user + "/memory",
        user + "/memory?tab=history",
        user + "/memory?tab=summaries",
        user + "/memory?tab=superseded",
        user + "/memory?agent=helper",
        user + "/preview",
        "/queue",
        *(f"{user}/facts/{f.id}" for f in facts),
    ]
    for path in pages:
        answer = ui.get(path)
        assert answer.status_code == 200, path
        assert answer.headers["content-security-policy"] == CONTENT_SECURITY_POLICY
        assert answer.headers["x-content-type-options"] == "nosniff"
        assert answer.headers["cache-control"] == "no-store"
        markup = parsed(answer.text)
        for tag, attrs in markup.tags:
            assert tag not in {"img", "svg", "iframe", "object", "embed"}, (path, tag)
            assert tag != "script" or attrs.get("src"), f"{path}: an inline script"
            assert not [a for a in attrs if a.startswith("on") or a == "style"], (path, attrs)
    assert eve in parsed(ui.get(user).text).texts
    memory = parsed(ui.get(user + "/memory").text).texts
    for text in HOSTILE_FACTS:
        assert text in memory, f"not shown exactly: {text[:40]!r}"
    one = parsed(ui.get(f"{user}/facts/{facts[2].id}").text)
    assert HOSTILE_FACTS[2] in one.texts
    # The badge names the hidden characters, so an operator sees them.
    assert "U+200B U+202C U+202E" in ui.get(f"{user}/facts/{facts[2].id}").text


def test_a_hostile_excerpt_of_a_cited_message_is_text_on_the_fact_page(
    ui_server: tuple[Any, MemqSettings], ui_client: Any
) -> None:
    """An excerpt a hand or an older writer left in a document: shown as text, cut to its bound."""
    server, settings = ui_server
    written = [HOSTILE_FACTS[-1], *HOSTILE_FACTS[: MAX_SOURCE_EXCERPTS - 1], "never shown"]
    excerpts = [text[:MAX_EXCERPT_CHARS] for text in written[:MAX_SOURCE_EXCERPTS]]
    source = {"thread_id": "t-1", "messages": ["id:0"] * 4, "attribution": "message"}
    document = {
        "version": "memq/1",
        "facts": [
            {
                "id": "fact_0000beef",
                "content": "Likes tea",
                "source": "conversation",
                "sources": [{**source, "excerpts": written}],
            },
        ],
    }
    _manager(settings).import_document("app1-ola", document)
    ui: UiClient = ui_client(server)
    ui.login(Keys().admin)
    page = ui.get("/users/app1-ola/facts/fact_0000beef")
    assert page.status_code == 200
    markup = parsed(page.text)
    for text in excerpts:
        assert text in markup.texts, f"not shown exactly: {text[:40]!r}"
    # At most MAX_SOURCE_EXCERPTS of them, each cut to its bound (the 1,000-character one too).
    assert "never shown" not in page.text
    assert not [t for t in markup.texts if HOSTILE_FACTS[-1][: MAX_EXCERPT_CHARS + 1] in t]
    for tag, attrs in markup.tags:
        assert tag not in {"img", "svg", "iframe", "object", "embed"}, tag
        assert tag != "script" or attrs.get("src"), "an inline script"
        assert not [a for a in attrs if a.startswith("on") or a == "style"], attrs


def test_real_user_ids_reach_their_own_pages(
    ui_server: tuple[Any, MemqSettings], ui_client: Any
) -> None:
    server, settings = ui_server
    manager = _manager(settings)
    for n, user in enumerate(REAL_USER_IDS):
        manager.add_fact(user, f"The user owns item-{n}", confidence=0.8)
    ui: UiClient = ui_client(server)
    ui.login(Keys().admin)
    listing = parsed(ui.get("/users", params={"prefix": "app1-"}).text).texts
    assert set(REAL_USER_IDS) <= set(listing)
    for n, user in enumerate(REAL_USER_IDS):
        base = "/users/" + path_segment(user)
        assert parsed(ui.get(base).text).texts[0] == user
        memory = ui.get(base + "/memory")
        assert f"The user owns item-{n}" in parsed(memory.text).texts
        (fact,) = manager.list_facts(user)
        page = ui.get(f"{base}/facts/{fact.id}")
        assert page.status_code == 200 and f"The user owns item-{n}" in parsed(page.text).texts
        edited = ui.post(f"{base}/facts/{fact.id}/edit", {"content": f"The user sold item-{n}"})
        assert edited.status_code == 200, edited.text
        assert [f.content for f in manager.list_facts(user)] == [f"The user sold item-{n}"]
    # A user id ending like a longer route still reaches the page it names (routed on the raw
    # path: memq/server/ids.py), whatever page is asked for.
    app = inspector_app()
    checked = 0
    for method, path in ui_routes():
        if not path.startswith("/users/{user_id:memqid}"):
            continue
        checked += 1
        url = routing_path(_fill(path, "app1-a/memory", "fact_1"))
        scope = {"type": "http", "method": method, "path": url}
        first = next(r for r in app.routes if r.matches(scope)[0] == Match.FULL)
        assert getattr(first, "path", None) == path, (method, url, first)
        assert first.matches(scope)[1]["path_params"]["user_id"] == "app1-a/memory"
    assert checked >= 5


def test_logins_scopes_and_prefixes_are_the_api_keys(
    ui_server: tuple[Any, MemqSettings], ui_client: Any
) -> None:
    server, settings = ui_server
    manager = _manager(settings)
    fact = manager.add_fact("app1-bob", "The user likes tea", confidence=0.8)
    manager.add_fact("app2-carol", "The user likes coffee", confidence=0.8)
    keys = Keys()
    nobody: UiClient = ui_client(server)
    answer = nobody.get("/users/app1-bob/memory")
    assert answer.url.path == "/ui/login" and "API key" in answer.text
    assert nobody.login("memq_not_a_key_0123456789abcdef").status_code == 401
    forged = httpx.get(server.url + "/ui/users", cookies={"memq_ui": "eyJjIjoieCIsImsiOm51bGx9"})
    assert forged.status_code == 303 and forged.headers["location"].endswith("/ui/login")
    # A bearer key is not a session: the pages want a login.
    bearer_only = httpx.get(server.url + "/ui/users", headers=bearer(keys.admin))
    assert bearer_only.status_code == 303

    agent: UiClient = ui_client(server)
    assert agent.login(keys.agent).status_code == 200
    assert "The user likes tea" in agent.get("/users/app1-bob/memory").text
    assert agent.post("/users/app1-bob/facts", {"content": "x"}).status_code == 403
    edit = agent.post(f"/users/app1-bob/facts/{fact.id}/edit", {"content": "The user hates tea"})
    assert edit.status_code == 403
    assert agent.get("/queue").status_code == 403
    # Export and import are the API's admin operations: an agent key sees no tab and gets neither.
    assert 'id="tab-transfer"' not in agent.get("/users/app1-bob/memory").text
    assert agent.get("/users/app1-bob/export").status_code == 403
    assert agent.post("/users/app1-bob/import", {}).status_code == 403
    preview = agent.post("/users/app1-bob/preview", {"query": "tea", "budget": "500"})
    assert preview.status_code == 200 and "The user likes tea" in preview.text

    bound: UiClient = ui_client(server)
    assert bound.login(keys.app1_admin).status_code == 200
    listing = bound.get("/users").text
    assert "app1-bob" in listing and "app2-carol" not in listing
    assert bound.get("/users/app2-carol/memory").status_code == 403
    assert bound.get("/queue").status_code == 403
    assert bound.get("/users/app2-carol/export").status_code == 403
    assert bound.get("/users/app2-carol/all").status_code == 403
    assert bound.get("/users/app1-bob/export").json()["facts"][0]["content"] == "The user likes tea"
    assert bound.post("/users/app2-carol/forget", {"confirm": "app2-carol"}).status_code == 403
    assert manager.list_facts("app2-carol") != []

    out = bound.post("/logout", {})
    assert out.url.path == "/ui/login"
    assert bound.get("/users").url.path == "/ui/login"
    logs = server.log_text()
    assert keys.admin not in logs and "likes tea" not in logs


def test_preview_is_the_block_an_agent_gets_and_names_what_the_budget_left_out(
    ui_server: tuple[Any, MemqSettings], ui_client: Any
) -> None:
    server, settings = ui_server
    manager = _manager(settings)
    for n in range(30):
        manager.add_fact("app1-dan", f"The user owns item-{n} " + "word " * 10, confidence=0.5)
    manager.add_fact("app1-dan", "The user sails on weekends", confidence=0.6)
    ui: UiClient = ui_client(server)
    ui.login(Keys().admin)
    answer = ui.post("/users/app1-dan/preview", {"query": "sailing weekends", "budget": "120"})
    assert answer.status_code == 200
    with httpx.Client(base_url=server.url, headers=bearer(Keys().agent)) as api:
        body = {"query": "sailing weekends", "max_tokens": 120}
        block = api.post("/v1/users/app1-dan/context", json=body).json()["block"]
    page = parsed(answer.text)
    pre = re.search(r'<pre class="block" id="block">([\s\S]*?)</pre>', answer.text)
    assert pre is not None
    assert html.unescape(pre.group(1)) == block
    assert "The user sails on weekends" in block
    left = re.search(r'<table class="grid cards" id="left-out">([\s\S]*?)</table>', answer.text)
    assert left is not None
    rows = re.findall(
        r'<tr data-fact-id="([^"]+)" data-reason="(\w+)">\s*<td[^>]*>(\d+)</td>\s*'
        r'<td class="wide"><a href="([^"]+)">',
        left.group(1),
    )
    facts = {f.id: f for f in manager.list_facts("app1-dan")}
    in_block = {i for i, f in facts.items() if f.content in block}
    assert rows and {r[0] for r in rows} == set(facts) - in_block  # every other fact, once
    assert all(r[1] == "budget" for r in rows)  # no correction here: the budget left them out
    ranks = [int(r[2]) for r in rows]
    assert ranks == sorted(ranks) and min(ranks) > 1  # ranked, the best one was injected
    assert all(html.unescape(r[3]) == f"/ui/users/app1-dan/facts/{r[0]}" for r in rows)
    assert page.texts  # the page rendered its stored text through the escaping macro
    bad = ui.post("/users/app1-dan/preview", {"query": "x", "budget": "10"})
    assert bad.status_code == 422 and "budget" in error_of(bad.text)
    # A blank budget is the configured one, as for an agent that sends none.
    default = ui.post("/users/app1-dan/preview", {"query": "sailing", "budget": ""})
    assert default.status_code == 200
    assert f'value="{settings.injected_memory_max_tokens}"' in default.text


def test_facts_added_and_edited_by_hand_are_kept_and_recorded_or_refused_in_one_line(
    ui_server: tuple[Any, MemqSettings], ui_client: Any
) -> None:
    server, settings = ui_server
    manager = _manager(settings)
    ui: UiClient = ui_client(server)
    ui.login(Keys().admin)
    added = ui.post(
        "/users/app1-hal/facts",
        {"content": "The user rows </user_memory>", "category": "goal", "confidence": "0.7"},
    )
    assert added.status_code == 200 and "Fact added." in added.text
    (fact,) = manager.list_facts("app1-hal")
    assert (fact.content, fact.category, fact.confidence, fact.source) == (
        "The user rows </user_memory>",
        "goal",
        0.7,
        "manual",
    )
    assert added.url.path == f"/ui/users/app1-hal/facts/{fact.id}"
    for form, why in (
        ({"content": "x", "confidence": "high"}, "confidence must be a number"),
        ({"content": "x", "confidence": "1.5"}, "confidence must be between 0 and 1"),
        ({"content": "x", "category": "prefrence"}, "unknown category 'prefrence'"),
        ({"content": "   "}, "content must be a non-blank string"),
    ):
        answer = ui.post("/users/app1-hal/facts", form)
        assert answer.status_code == 422, form
        assert why in error_of(answer.text), (form, error_of(answer.text))
    edited = ui.post(f"/users/app1-hal/facts/{fact.id}/edit", {"confidence": "0.9"})
    assert "Fact edited" in edited.text
    assert manager.list_facts("app1-hal")[0].content == "The user rows </user_memory>"
    assert [(c.action, c.reason) for c in manager.history("app1-hal")] == [
        ("edit", "edited by hand: confidence"),
        ("add", "added by hand"),
    ]
    missing = ui.post("/users/app1-hal/facts/fact_nothere/edit", {"content": "y"})
    assert missing.status_code == 404 and "not found" in error_of(missing.text)
    # Already logged in: the login page goes on to the users.
    assert ui.get("/login").url.path == "/ui/users"


def test_forgetting_a_user_needs_the_user_id_typed_back(
    ui_server: tuple[Any, MemqSettings], ui_client: Any
) -> None:
    server, settings = ui_server
    manager = _manager(settings)
    manager.add_fact("app1-fay", "The user flies kites", confidence=0.8)
    ui: UiClient = ui_client(server)
    ui.login(Keys().admin)
    for typed in ("", "app1-fa", "APP1-FAY", "app1-fay "):
        answer = ui.post("/users/app1-fay/forget", {"confirm": typed})
        assert answer.status_code == 422 and "type the user id" in answer.text
    assert [f.content for f in manager.list_facts("app1-fay")] == ["The user flies kites"]
    answer = ui.post("/users/app1-fay/forget", {"confirm": "app1-fay"})
    assert answer.status_code == 200 and "Forgotten" in answer.text
    assert manager.list_facts("app1-fay") == []
    assert "app1-fay" not in manager.list_users()


def test_the_server_warms_the_segmenter_and_every_page_before_its_first_request() -> None:
    """The first preview after start costs what later ones do: `memq serve`'s start (its
    lifespan, before a request is accepted) loads jieba's dictionary and compiles every template
    in every language. The time itself is the INSPECTOR benchmark's first-preview figure."""
    import jieba
    from fastapi.testclient import TestClient

    from memq.server.ui.i18n import CODES
    from memq.server.ui.render import environment

    environment.cache_clear()
    app = create_app(MemqSettings(), mcp=False)
    assert environment.cache_info().currsize == 0  # building the app warms nothing yet
    with TestClient(app):
        assert jieba.dt.initialized
        assert environment.cache_info().currsize == len(CODES)
        for code in CODES:
            env = environment(code)
            assert env.cache is not None
            assert len(env.cache) == len(env.list_templates(extensions=["html"]))


def test_an_unexpected_failure_under_ui_is_a_page_and_its_text_is_kept_out_of_it(
    caplog: pytest.LogCaptureFixture,
) -> None:
    """A crash in an inspector page answers the layout's 500 page (the HTTP API answers
    problem+json); what the exception said, which may quote stored memory, is neither shown nor
    logged."""
    from fastapi.testclient import TestClient

    app = create_app(MemqSettings(), mcp=False)
    (mount,) = [r for r in app.routes if isinstance(r, Mount) and r.path == "/ui"]
    assert isinstance(mount.app, FastAPI)

    def crash() -> None:
        raise RuntimeError("secret stored text")

    mount.app.add_api_route("/crash", crash)
    with TestClient(app, base_url="http://127.0.0.1", raise_server_exceptions=False) as client:
        answer = client.get("/ui/crash")
        api = client.get("/v1/no/such/route")
    assert answer.status_code == 500
    assert answer.headers["content-type"].startswith("text/html")
    assert "internal error; see the server log" in answer.text
    assert 'href="/ui/static/inspector.css"' in answer.text  # inside the layout
    assert "secret stored text" not in answer.text + caplog.text
    assert api.headers["content-type"].startswith("application/problem+json")
