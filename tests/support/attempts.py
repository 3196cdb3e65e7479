"""See whether the producer tried Redis at all, instead of timing how long a call took.

``counting_client(settings)`` is the client the producer would build for itself (same pool, same
short timeouts), as a real ``redis.Redis`` that also records which thread sent each script call
(every enqueue is one EVALSHA). A test hands it to ``MemoryProducer(settings, redis=...)`` and then
asserts "the agent's thread sent one command for ten calls" rather than "ten calls took < 2 s".
"""

from __future__ import annotations

import threading
from typing import Any

import redis

from memq.core.connection import redis_client
from memq.core.settings import MemqSettings


class AttemptCountingRedis(redis.Redis):
    """A real client; ``attempts`` lists the thread name of every EVALSHA sent through it."""

    attempts: list[str]

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        self.attempts.append(threading.current_thread().name)
        return super().evalsha(sha, numkeys, *keys_and_args)

    def attempts_from(self, thread: threading.Thread) -> int:
        return sum(1 for name in list(self.attempts) if name == thread.name)


def counting_client(settings: MemqSettings) -> AttemptCountingRedis:
    """The producer's own client configuration (its socket timeout included), counting."""
    configured = redis_client(settings, socket_timeout=settings.producer_timeout_seconds)
    client = AttemptCountingRedis(connection_pool=configured.connection_pool)
    client.attempts = []
    return client
