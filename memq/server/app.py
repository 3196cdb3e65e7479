"""The app factory: ``create_app(settings)`` → the FastAPI app of ``memq serve``.

Settings are read once by the caller and passed in; the keyring, the memq handles and the MCP
endpoint are built here, per app, so two apps in one process (tests, benchmarks) share nothing.
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack, asynccontextmanager
from typing import Any

from fastapi import FastAPI
from fastapi.routing import APIRoute

from memq.core.settings import MemqSettings
from memq.operations.service import MemqService
from memq.server import problems
from memq.server.auth import Authorize, Keyring
from memq.server.hosts import HostGuard, allowed_hosts
from memq.server.ids import RawPathRouting
from memq.server.limits import RequestGuard
from memq.server.routing import operation_id, problem_components

API_VERSION = "v1"
TITLE = "memq"
DESCRIPTION = (
    "Long-term user memory for LLM agents. Hand a conversation over after each turn (202: the "
    "caller never waits on extraction); read the memory block before the next. Every error is "
    "`application/problem+json`. Send `Authorization: Bearer <key>`."
)


def create_app(
    settings: MemqSettings,
    *,
    keyring: Keyring | None = None,
    service: MemqService | None = None,
    mcp: bool = True,
) -> FastAPI:
    """The HTTP API (and MCP at ``/mcp`` unless ``mcp=False``) over ``settings``.

    ``keyring`` defaults to the keys the settings name; ``service`` to handles built from the
    settings (closed at shutdown only when built here).
    """
    from memq.server import routes_admin, routes_agent, routes_ops
    from memq.server.ui import build_inspector, guard_pages, warm_pages

    keys = keyring if keyring is not None else Keyring.from_settings(settings)
    owned = service is None
    handles = service if service is not None else MemqService(settings)
    mcp_app = None
    if mcp:
        from memq.server.mcp_tools import build_http_mcp

        mcp_app = build_http_mcp(handles, settings)

    @asynccontextmanager
    async def lifespan(_app: FastAPI) -> AsyncIterator[None]:
        # The tokenizer and the segmenter, before the first recall needs them (~0.7 s), and the
        # inspector's templates: before the server accepts its first request.
        handles.injector(None).warm()
        warm_pages()
        async with AsyncExitStack() as stack:
            if mcp_app is not None:
                await stack.enter_async_context(mcp_app.lifespan())
            try:
                yield
            finally:
                if owned:
                    handles.close()

    app = FastAPI(
        title=TITLE,
        version=API_VERSION,
        description=DESCRIPTION,
        lifespan=lifespan,
        generate_unique_id_function=operation_id,
        root_path=settings.serve_root_path,
        # Swagger UI and ReDoc load their scripts from a CDN: nothing of memq depends on the
        # internet, so only the OpenAPI document itself is served.
        docs_url=None,
        redoc_url=None,
    )
    app.state.settings = settings
    app.state.keyring = keys
    app.state.service = handles
    problems.install(app)
    # The routers' routes join the app's own table (not `include_router`): each carries its
    # full path and its `Authorize` dependency, and `app.routes` lists every one of them, which
    # is what the test sweeping the route table for the auth check walks.
    for module in (routes_ops, routes_agent, routes_admin):
        app.router.routes.extend(module.router.routes)
    if mcp_app is not None:
        app.router.routes.append(mcp_app.route(keys))
    # The inspector: its own small app (HTML errors, session login), swept by its own tests.
    inspector = build_inspector(settings, keys, handles)
    app.mount("/ui", inspector, name="ui")
    app.add_middleware(
        RequestGuard,
        max_body_bytes=settings.serve_max_body_bytes,
        page_for=guard_pages(inspector),  # its refusals under /ui as the inspector's pages
    )
    # Routing on the raw path: an id with an encoded `/` reaches its own route (ids.py).
    app.add_middleware(RawPathRouting)
    hosts = allowed_hosts(settings)
    if hosts is not None:  # outermost: a rebinding page's request reaches nothing
        app.add_middleware(HostGuard, allowed=hosts, root_path=settings.serve_root_path)
    _document_public_routes(app)
    return app


def _document_public_routes(app: FastAPI) -> None:
    """The OpenAPI document lists no key for the public routes (the bearer scheme that every
    `Authorize` is would otherwise be listed on the health probes too)."""
    public = {
        route.path
        for route in app.routes
        if isinstance(route, APIRoute)
        and any(
            isinstance(d.call, Authorize) and d.call.operation is None
            for d in route.dependant.dependencies
        )
    }
    generate = app.openapi

    def openapi() -> dict[str, Any]:
        if app.openapi_schema is not None:
            return app.openapi_schema
        schema = generate()
        problem_components(schema)
        for path in public:
            for operation in schema["paths"].get(path, {}).values():
                operation.pop("security", None)
        return schema

    app.openapi = openapi  # type: ignore[method-assign]


def openapi_document() -> str:
    """The committed ``docs/openapi.json``: the app's OpenAPI on default settings, stable text
    (a test fails when it drifts from the app; regenerate with `memq serve --openapi`)."""
    # No root path: the committed document must not depend on the shell it is generated from.
    app = create_app(MemqSettings(serve_root_path=""), mcp=False)
    return json.dumps(app.openapi(), indent=2, ensure_ascii=False) + "\n"
