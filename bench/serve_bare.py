"""The baseline of the HTTP hand-off benchmark: a bare FastAPI endpoint on the same uvicorn
settings as `memq serve`, making the same single EVALSHA of `enqueue.lua` with the body's messages
as they came (no key check, no guard, no message filtering, no spool).

    python -m uvicorn --factory bench.serve_bare:create_app --port P   (MEMQ_* from the env)
"""

from __future__ import annotations

import json
import time
from importlib import resources
from typing import Annotated, Any

from fastapi import Body, FastAPI

from memq.core.connection import redis_client
from memq.core.identity import ContextKey
from memq.core.keys import KeySchema
from memq.core.settings import load_settings


def create_app() -> FastAPI:
    settings = load_settings()
    client = redis_client(settings, socket_timeout=settings.producer_timeout_seconds)
    script = client.register_script(
        resources.files("producer").joinpath("enqueue.lua").read_text(encoding="utf-8")
    )
    keys = KeySchema(settings.key_prefix, settings.shards)
    app = FastAPI(docs_url=None, redoc_url=None)

    @app.get("/healthz")
    def healthz() -> dict[str, str]:
        return {"status": "ok"}

    @app.post("/v1/users/{user_id}/conversations", status_code=202)
    def hand_off(user_id: str, body: Annotated[dict[str, Any], Body()]) -> dict[str, Any]:
        key = ContextKey(str(body["thread_id"]), user_id, None)
        q = keys.for_context(key.id)
        now = time.time_ns() // 1_000_000
        version, deadline, _code = script(
            keys=(q.context(key.id), q.due, q.inflight, q.dead, q.user_contexts(user_id)),
            args=(
                now,
                settings.debounce_ms,
                settings.max_delay_ms,
                "0",
                json.dumps(body["messages"]),
                key.thread_id,
                user_id,
                "",
                "",
                key.id,
                now,
                settings.context_retention_ms,
                settings.pending_max_bytes,
            ),
        )
        return {"status": "queued", "version": int(version), "deadline_ms": int(deadline)}

    return app
