"""The queue: the figures `memq stats` prints (refreshed live by a small script), and the dead
letters with their reasons, to retry or purge."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Form, Query
from fastapi.responses import HTMLResponse, RedirectResponse

from memq.server.ui.access import Page, QueueChanger, QueueViewer
from memq.server.ui.render import query

router = APIRouter()
# Dead letters shown on the page; `memq dead list` and the API list more.
MAX_LISTED_DEAD = 500
# What the page may say was done (the template words it, in the page's language).
DONE = ("retried", "purged")


# The first rows of `memq stats` are the queue's depths, shown even at zero; of the totals that
# follow, the ones still at zero say nothing to an operator triaging and are left out.
DEPTH_ROWS = 5


def triage_rows(rows: list[tuple[str, object]]) -> list[list[str]]:
    """The figures worth a look: the depths, then every total that is not zero."""
    return [
        [label, str(value)]
        for n, (label, value) in enumerate(rows)
        if n < DEPTH_ROWS or str(value) not in ("0", "0.0", "$0.000000")
    ]


def _stats(page: Page) -> dict[str, Any]:
    from memq.core.clock import now_ms
    from memq.core.metrics import read_snapshot, summarise
    from memq.operations.stats_rows import stats_rows

    svc = page.svc
    now = now_ms()
    summary = summarise(read_snapshot(svc.redis, svc.settings, now))
    return {
        "now_ms": now,
        "rows": triage_rows(stats_rows(summary)),
        "extractions": sum(summary["extractions"].values()),
        "tokens": summary["prompt_tokens"] + summary["completion_tokens"],
        "dead": summary["dead"],
    }


@router.get("/queue", name="ui_queue")
def queue(
    page: QueueViewer,
    done: Annotated[str, Query(max_length=20)] = "",
    count: Annotated[int, Query(ge=0)] = 0,
) -> HTMLResponse:
    from memq.core.identity import ContextKey

    dead = []
    for entry in page.svc.queue.dead_list(MAX_LISTED_DEAD):
        try:
            key: ContextKey | None = ContextKey.from_id(entry.context_id)
        except ValueError:
            key = None
        dead.append((entry, key))
    return page.html(
        "queue.html", stats=_stats(page), dead=dead, done=done if done in DONE else "", count=count
    )


@router.get("/queue/stats.json", name="ui_queue_stats")
def queue_stats(page: QueueViewer) -> dict[str, Any]:
    """What the page's script polls: the same figures, and the totals it turns into rates."""
    return _stats(page)


def chosen(
    ticked: list[str] | None, only: str | None = None, every: bool = False
) -> list[str] | Literal["all"]:
    """The dead letters one submit of the queue's form acts on: all of them (a bulk button's
    ``every``), the one row whose own button was pressed (``only``), else the ticked rows (the
    service refuses none, or more than its cap, in one line)."""
    if every:
        return "all"
    if only:
        return [only]
    return list(dict.fromkeys(t for t in ticked or () if t))


Ticked = Annotated[list[str] | None, Form(alias="context_id")]
Only = Annotated[str, Form()]
Every = Annotated[str, Form()]


@router.post("/queue/dead/retry", name="ui_dead_retry")
def retry(
    page: QueueChanger, context_id: Ticked = None, only: Only = "", every: Every = ""
) -> RedirectResponse:
    count = page.svc.retry_dead(page.principal, chosen(context_id, only, bool(every)))
    return RedirectResponse(page.base + "/queue" + query({"done": "retried", "count": count}), 303)


@router.post("/queue/dead/purge", name="ui_dead_purge")
def purge(
    page: QueueChanger, context_id: Ticked = None, only: Only = "", every: Every = ""
) -> RedirectResponse:
    count = page.svc.purge_dead(page.principal, chosen(context_id, only, bool(every)))
    return RedirectResponse(page.base + "/queue" + query({"done": "purged", "count": count}), 303)
