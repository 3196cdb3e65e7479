"""Operations: health probes (public), queue stats and dead letters (scope ``admin``, never a
key bound to a user-id prefix: these span every user)."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import Depends
from fastapi.responses import JSONResponse
from pydantic import BaseModel, ConfigDict, Field

from memq.core.connection import REDIS_ERRORS
from memq.operations.access import Principal
from memq.operations.paging import DEFAULT_LIMIT, needed, page
from memq.server.auth import PUBLIC
from memq.server.problems import problem
from memq.server.routing import Cursor, Limit, Service, caller, new_router

router = new_router()


@router.get("/healthz", tags=["ops"], dependencies=[Depends(PUBLIC)])
def healthz() -> dict[str, str]:
    """The process answers (liveness)."""
    return {"status": "ok"}


@router.get(
    "/readyz",
    tags=["ops"],
    dependencies=[Depends(PUBLIC)],
    response_model=None,
)
def readyz(svc: Service) -> dict[str, Any] | JSONResponse:
    """Redis answers and beat ticks (readiness): 200, else 503 naming what is missing."""
    from memq.core.clock import now_ms
    from memq.core.metrics import beat_alive, read_snapshot

    now = now_ms()
    try:
        svc.redis.ping()
        snapshot = read_snapshot(svc.redis, svc.settings, now).metrics
    except REDIS_ERRORS:
        return problem(503, "Redis does not answer")
    last = snapshot.last_tick_ms
    age_ms = None if last is None else max(0, now - last)
    if not beat_alive(last, now, svc.settings.tick_seconds):
        seen = "never" if age_ms is None else f"{age_ms / 1000:.0f} s ago"
        return problem(503, f"beat is not ticking (last tick {seen})", redis="ok")
    return {"status": "ready", "redis": "ok", "last_tick_age_ms": age_ms}


@router.get("/v1/queue/stats", tags=["ops"])
def queue_stats(who: Annotated[Principal, caller("stats")], svc: Service) -> dict[str, Any]:
    """Queue depths, lag, extraction outcomes and tokens (what `memq stats --json` prints)."""
    return svc.stats(who)


class DeadLetter(BaseModel):
    context_id: str
    dead_at_ms: int
    attempts: int
    last_error: str
    expires_at_ms: int


class DeadLetters(BaseModel):
    dead_letters: list[DeadLetter]
    next_cursor: str | None = Field(
        default=None, description="where the next page starts (pass it as `cursor`)"
    )


@router.get("/v1/dead-letters", tags=["ops"], response_model=DeadLetters)
def dead_letters(
    who: Annotated[Principal, caller("dead_letters")],
    svc: Service,
    limit: Limit = DEFAULT_LIMIT,
    cursor: Cursor = None,
) -> DeadLetters:
    """Dead contexts with their attempts and last error (`memq dead list`), a page at a time."""
    loaded = page(svc.dead_letters(who, limit=needed(limit, cursor)), limit, cursor)
    entries = loaded.items
    return DeadLetters(
        dead_letters=[
            DeadLetter(
                context_id=e.context_id,
                dead_at_ms=e.dead_at_ms,
                attempts=e.attempts,
                last_error=e.last_error,
                expires_at_ms=e.expires_at_ms,
            )
            for e in entries
        ],
        next_cursor=loaded.next_cursor,
    )


class DeadAction(BaseModel):
    model_config = ConfigDict(extra="forbid")

    ids: list[str] | Literal["all"] = Field(description='context ids, or "all"')


class DeadActionDone(BaseModel):
    count: int = Field(description="how many dead letters were retried or purged")


@router.post(
    "/v1/dead-letters/retry",
    tags=["ops"],
    response_model=DeadActionDone,
)
def retry_dead_letters(
    who: Annotated[Principal, caller("retry_dead")],
    body: DeadAction,
    svc: Service,
) -> DeadActionDone:
    """Put dead letters back in the queue, due now (`memq dead retry`)."""
    return DeadActionDone(count=svc.retry_dead(who, body.ids))


@router.post(
    "/v1/dead-letters/purge",
    tags=["ops"],
    response_model=DeadActionDone,
)
def purge_dead_letters(
    who: Annotated[Principal, caller("purge_dead")],
    body: DeadAction,
    svc: Service,
) -> DeadActionDone:
    """Delete dead letters for good (`memq dead purge`)."""
    return DeadActionDone(count=svc.purge_dead(who, body.ids))
