"""The memq inspector, served by ``memq serve`` at ``/ui``: see, question and correct what memq
learnt, and the queue behind it.

Server-rendered pages (Jinja2, autoescaped) over the same memory manager, injector, erasure and
queue client the CLI and the HTTP API use; a login that exchanges an API key for a signed session
cookie (:mod:`.session`), one access dependency per page (:mod:`.access`), CSRF on every POST and
a Content-Security-Policy that allows nothing but memq's own assets (:mod:`.render`). The routes
are grouped by area: ``routes_session``, ``routes_memory``, ``routes_correct``, ``routes_queue``.
"""

from __future__ import annotations

from memq.server.ui.app import build_inspector, guard_pages, warm_pages

__all__ = ["build_inspector", "guard_pages", "warm_pages"]
