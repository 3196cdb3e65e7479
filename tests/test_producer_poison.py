"""One request that cannot be sent never stalls a shared producer: it is not a Redis outage, so it
never starts the back-off, it never blocks the spool behind it, and after a few tries it is dropped
and counted (logged by type, never with its text)."""

from __future__ import annotations

import logging
from typing import Any

import pytest
import redis

from memq.core.identity import ContextKey
from memq.core.keys import KeySchema
from memq.core.settings import MemqSettings
from producer.producer import MemoryProducer
from tests.support.waiting import wait_for

POISON = "I love tea, unexpectedly"


class PoisonedRedis(redis.Redis):
    """A real client to the real redis-server that fails, with an error that is not a Redis
    error, for every request carrying the poison text (the fault sits at the boundary)."""

    def evalsha(self, sha: str, numkeys: int, *keys_and_args: Any) -> Any:
        if any(isinstance(arg, str) and POISON in arg for arg in keys_and_args):
            raise UnicodeEncodeError("utf-8", POISON, 0, 1, "surrogates not allowed")
        return super().evalsha(sha, numkeys, *keys_and_args)


def dialogue(user_text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": user_text}, {"role": "assistant", "content": "ok"}]


@pytest.mark.integration
def test_a_poison_request_neither_backs_off_nor_blocks_other_users(
    settings: MemqSettings, caplog: pytest.LogCaptureFixture
) -> None:
    client = PoisonedRedis.from_url(settings.redis_url, decode_responses=True, socket_timeout=1)
    caplog.set_level(logging.INFO)
    with MemoryProducer(settings, redis=client) as producer:
        assert producer.after_agent("poison", "bob", None, dialogue(POISON)) is False
        # Every other user's turn goes straight to Redis: no back-off, nothing spooled.
        sent = [producer.after_agent(f"t{i}", f"u{i}", None, dialogue("hi")) for i in range(60)]
        assert sent == [True] * 60
        wait_for(lambda: producer.stats.poisoned == 1, what="the poison dropped")
        wait_for(lambda: producer.spool_size == 0, what="the spool empty")
        stats = producer.stats
    assert (stats.enqueued, stats.dropped, stats.errors) == (60, 0, 3)
    assert POISON not in caplog.text
    dropped = [r for r in caplog.records if "failed tries" in r.getMessage()]
    assert len(dropped) == 1 and "UnicodeEncodeError" in dropped[0].getMessage()
    assert not [r for r in caplog.records if "unavailable" in r.getMessage()]


@pytest.mark.integration
def test_a_poison_request_in_the_spool_does_not_hold_up_the_rest(settings: MemqSettings) -> None:
    client = PoisonedRedis.from_url(settings.redis_url, decode_responses=True, socket_timeout=1)
    with MemoryProducer(settings, redis=client) as producer:
        producer._backoff.failed()  # as after an outage: the next turns are spooled
        for thread, text in (("a", "tea"), ("b", POISON), ("c", "coffee")):
            assert producer.after_agent(thread, "u", None, dialogue(text)) is False
        assert producer.drain_spool() == 2
        assert producer.spool_size == 0 and producer.stats.poisoned == 1


@pytest.mark.integration
def test_a_trace_id_with_a_lone_surrogate_is_replaced(
    settings: MemqSettings, redis_client: redis.Redis
) -> None:
    with MemoryProducer(settings) as producer:
        assert producer.after_agent("t", "u", None, dialogue("hi"), trace_id="tr-\ud800-1")
        assert producer.stats.errors == 0
    key = ContextKey.create("t", "u", None).id
    stored = redis_client.hget(
        KeySchema(settings.key_prefix).for_context(key).context(key), "trace_id"
    )
    assert stored == "tr-?-1"


@pytest.mark.integration
@pytest.mark.parametrize(
    "ids", [("t-\ud800", "u"), ("t", "u-\udfff"), ("t\x00", "u")], ids=["thread", "user", "nul"]
)
def test_an_id_that_cannot_be_encoded_never_holds_up_the_others(
    settings: MemqSettings, ids: tuple[str, str]
) -> None:
    with MemoryProducer(settings) as producer:
        assert producer.after_agent(*ids, None, dialogue("hi")) is False
        assert [producer.after_agent(f"t{i}", "u", None, dialogue("hi")) for i in range(5)] == [
            True
        ] * 5
        wait_for(lambda: producer.spool_size == 0, what="nothing left behind")
        assert producer.stats.enqueued == 5
