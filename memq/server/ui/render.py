"""Templates and the headers every inspector response carries.

Jinja2 with autoescape on for every template and ``StrictUndefined``: a stored string is always
escaped, and a template that names a missing value fails in the tests instead of printing blank.
The Content-Security-Policy allows scripts, styles and images from memq itself only, and no
inline script or style at all, so even markup that slipped through could not run.
"""

from __future__ import annotations

import functools
import gettext
import time
import unicodedata
from collections.abc import Mapping
from datetime import datetime
from typing import Any
from urllib.parse import urlencode

from jinja2 import Environment, PackageLoader, StrictUndefined
from markupsafe import Markup, escape
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from memq.server.ids import path_segment as id_segment

CONTENT_SECURITY_POLICY = (
    "default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self'; "
    "connect-src 'self'; form-action 'self'; frame-ancestors 'none'; base-uri 'none'"
)
SECURITY_HEADERS: tuple[tuple[bytes, bytes], ...] = (
    (b"content-security-policy", CONTENT_SECURITY_POLICY.encode()),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    (b"x-frame-options", b"DENY"),
    (b"cross-origin-opener-policy", b"same-origin"),
)
# Pages show users' memories: never kept by a browser cache or a proxy. Static assets may be.
NO_STORE = (b"cache-control", b"no-store")


class SecurityHeaders:
    """ASGI middleware of the inspector: the headers above on every response, and a
    ``Server-Timing`` header with the time the page took to build (what the benchmark reads)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        static = scope.get("path", "").startswith("/static/")
        started = time.perf_counter()

        async def with_headers(message: Message) -> None:
            if message["type"] == "http.response.start":
                headers = [
                    (k, v)
                    for k, v in message.get("headers", [])
                    if k.lower() not in {name for name, _ in SECURITY_HEADERS}
                ]
                headers += list(SECURITY_HEADERS)
                if not static:
                    headers.append(NO_STORE)
                took_ms = (time.perf_counter() - started) * 1000
                headers.append((b"server-timing", f"app;dur={took_ms:.2f}".encode()))
                message["headers"] = headers
            await send(message)

        await self.app(scope, receive, with_headers)


def path_segment(value: object) -> str:
    """A user id, agent name or fact id as one URL path segment (``a|b`` → ``a%7Cb``): the
    encoding the app routes on (memq/server/ids.py)."""
    return id_segment(str(value))


def query(params: Mapping[str, object | None]) -> str:
    """``?a=1&b=2`` of the params that are not None ("" when none)."""
    kept = {k: str(v) for k, v in params.items() if v is not None and v != ""}
    return "?" + urlencode(kept) if kept else ""


def when(value: datetime | None) -> str:
    return "—" if value is None else value.strftime("%Y-%m-%d %H:%M UTC")


@functools.lru_cache(maxsize=4096)
def when_ms(epoch_ms: int | None) -> str:
    """An epoch-ms time as the pages show it. Kept: a page of dead letters formats two times a
    row, and each is a ``datetime`` built and formatted (a pure function of the number)."""
    from datetime import UTC

    if not epoch_ms:
        return "—"
    return when(datetime.fromtimestamp(epoch_ms / 1000, UTC))


def hidden_characters(text: str) -> list[str]:
    """Code points of the invisible and control characters in ``text`` (``U+202E``), so an
    operator sees that a fact holds them; the text itself is shown as stored."""
    if text.isprintable():  # the common case, in C: no control, format or private character
        return []
    found = {
        f"U+{ord(c):04X}"
        for c in text
        if unicodedata.category(c) in ("Cc", "Cf", "Cs", "Co", "Zl", "Zp") and c not in "\n\t"
    }
    return sorted(found)


def stored_text(value: object, css_class: str = "") -> Markup:
    """A stored string as page text: escaped, isolated from the page's direction (so a direction
    override inside it cannot reorder what surrounds it), flagged when it holds invisible or
    control characters. A filter, not a macro: a page of 200 facts calls it a thousand times."""
    text = "" if value is None else str(value)
    classes = escape(f"ut {css_class}".strip())
    out = f'<span class="{classes}">{escape(text)}</span>'
    hidden = hidden_characters(text)
    if hidden:
        out += (
            ' <span class="hidden-chars" title="invisible or control characters in the stored '
            f'text">{" ".join(hidden)}</span>'
        )
    return Markup(out)


def dead_letter_row(
    entry: Any, key: Any, index: int, base: str, labels: Mapping[str, str]
) -> Markup:
    """One row of the queue page's dead letters (``entry`` a ``DeadEntry``, ``key`` its
    ``ContextKey`` or None when the id does not parse), its labels in the page's language. One
    f-string: in the template each row was some forty escaped outputs, a page of 500 rows twenty
    thousand."""
    cid, at = escape(entry.context_id), labels
    pick = (
        f'<td class="pick"><input type="checkbox" name="context_id" value="{cid}" '
        f'id="pick-{index}" aria-label="{escape(at["select"])} {index}"></td>'
    )
    if key is None:
        who = f'      <td colspan="3" class="id-cell">{stored_text(entry.context_id)}</td>\n'
    else:
        agent = (
            stored_text(key.agent_name)
            if key.agent_name
            else Markup(f"<em>{escape(at['global'])}</em>")
        )
        who = (
            f'      <td class="id-cell user-cell" data-label="{escape(at["user"])}"><a href="'
            f'{escape(base)}/users/{escape(path_segment(key.user_id))}">'
            f"{stored_text(key.user_id)}</a></td>\n"
            f'      <td class="id-cell thread-cell" data-label="{escape(at["thread"])}">'
            f"{stored_text(key.thread_id)}</td>\n"
            f'      <td class="id-cell" data-label="{escape(at["agent"])}">{agent}</td>\n'
        )
    to = escape(base)
    return Markup(
        f'    <tr data-context="{cid}">\n      {pick}\n{who}'
        f'      <td class="when" data-label="{escape(at["died"])}">'
        f"{escape(when_ms(entry.dead_at_ms))}"
        f'<span class="expires muted"><span class="sr-only">{escape(at["expires"])}</span> → '
        f"{escape(when_ms(entry.expires_at_ms))}</span></td>\n"
        f'      <td class="num" data-label="{escape(at["attempts"])}">'
        f"{escape(entry.attempts)}</td>\n"
        f'      <td class="reason wide" data-label="{escape(at["reason"])}">'
        f"{stored_text(entry.last_error)}</td>\n"
        f'      <td class="actions"><button type="submit" class="retry" name="only" '
        f'value="{cid}" formaction="{to}/queue/dead/retry">{escape(at["retry"])}</button> '
        f'<button type="submit" class="danger purge" name="only" value="{cid}" '
        f'formaction="{to}/queue/dead/purge" data-confirm="{escape(at["purge_one"])}">'
        f"{escape(at['purge'])}</button></td>\n    </tr>"
    )


def build_environment(translations: gettext.NullTranslations | None = None) -> Environment:
    """The templates' environment, its ``_()`` answering from ``translations`` (English when
    None)."""
    env = Environment(
        loader=PackageLoader("memq.server.ui", "templates"),
        autoescape=True,
        undefined=StrictUndefined,
        trim_blocks=True,
        lstrip_blocks=True,
        extensions=["jinja2.ext.i18n"],
    )
    env.install_gettext_translations(  # type: ignore[attr-defined]
        translations or gettext.NullTranslations(), newstyle=True
    )
    env.filters["seg"] = path_segment
    env.filters["when"] = when
    env.filters["when_ms"] = when_ms
    env.filters["ut"] = stored_text
    env.globals["query"] = query
    env.globals["dead_letter_row"] = dead_letter_row
    return env


@functools.cache
def environment(lang: str) -> Environment:
    """One environment per language, built when first used (templates compile once per
    language and process)."""
    from memq.server.ui.i18n import translations

    return build_environment(translations(lang))


def render(template: str, context: Mapping[str, Any]) -> str:
    """``template`` in the context's ``lang`` (English when it names none)."""
    from memq.server.ui.i18n import DEFAULT, LANGUAGES

    lang = str(context.get("lang", DEFAULT))
    full = {"lang": lang, "languages": LANGUAGES, "here_path": "", **context}
    return environment(lang).get_template(template).render(**full)
