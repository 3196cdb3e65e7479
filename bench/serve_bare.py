"""The baseline of the HTTP hand-off benchmark: a bare FastAPI endpoint on the same uvicorn
settings as `memq serve`, making the same single EVALSHA of `enqueue.lua` (through the same
`Enqueuer`) with the body's messages as they came: no key check, no guard, no message filtering
or caps, no spool.

    python -m uvicorn --factory bench.serve_bare:create_app --port P   (MEMQ_* from the env)
"""

from __future__ import annotations

import json
import time
from typing import Annotated, Any

from fastapi import Body, FastAPI

from memq.core.connection import redis_client
from memq.core.identity import ContextKey
from memq.core.keys import KeySchema
from memq.core.settings import load_settings
from producer.enqueue import Enqueuer, EnqueueRequest


def create_app() -> FastAPI:
    settings = load_settings()
    client = redis_client(settings, socket_timeout=settings.producer_timeout_seconds)
    enqueue = Enqueuer(
        client,
        KeySchema(settings.key_prefix, settings.shards),
        debounce_ms=settings.debounce_ms,
        max_delay_ms=settings.max_delay_ms,
        retention_ms=settings.context_retention_ms,
        pending_max_bytes=settings.pending_max_bytes,
        context_max_bytes=settings.context_max_bytes,
    )
    app = FastAPI(docs_url=None, redoc_url=None)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/users/{user_id}/conversations", status_code=202)
    def hand_off(user_id: str, body: Annotated[dict[str, Any], Body()]) -> dict[str, Any]:
        now = time.time_ns() // 1_000_000
        request = EnqueueRequest(
            key=ContextKey(str(body["thread_id"]), user_id, None),
            messages_json=json.dumps(body["messages"]),
            captured_ms=now,
        )
        result = enqueue(request, now)
        return {"status": "queued", "version": result.version, "deadline_ms": result.deadline_ms}

    return app
