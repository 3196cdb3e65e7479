"""What the scripted server answers: one scripted reply, and the chat completion body a reply
becomes (the synchronous endpoint and a batch's output lines write the same body)."""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Reply:
    content: str | None = None  # assistant message text (a 200 completion)
    status: int = 200
    body: Any = None  # raw JSON body or bytes, overrides content
    headers: dict[str, str] = field(default_factory=dict)
    delay_seconds: float = 0.0
    # Held until the test sets it (bounded by the wait deadline): a call kept in flight for as
    # long as the test needs, where a guessed delay may end before a loaded machine got there.
    release: threading.Event | None = None
    prompt_tokens: int = 100
    completion_tokens: int = 20


def completion_body(reply: Reply, model: str) -> dict[str, Any]:
    return {
        "id": "chatcmpl-scripted",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": model,
        "choices": [
            {
                "index": 0,
                "message": {"role": "assistant", "content": reply.content},
                "finish_reason": "stop",
            }
        ],
        "usage": {
            "prompt_tokens": reply.prompt_tokens,
            "completion_tokens": reply.completion_tokens,
            "total_tokens": reply.prompt_tokens + reply.completion_tokens,
        },
    }
