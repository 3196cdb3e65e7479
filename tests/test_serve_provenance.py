"""Provenance over HTTP against a real `memq serve`, Redis, Celery worker and beat, with the real
`openai` client and the scripted citing model: why a fact is held (the message it came from
included), what was superseded, and forgetting one thread through the admin route."""

from __future__ import annotations

from typing import Any

import httpx
import pytest

from memq.core.settings import MemqSettings
from memq.server.ui.render import path_segment
from memq.testing.openai_server import CitingModel, Teach
from memq.testing.redis_dump import dump_redis
from tests.support.celery_procs import CeleryProcs, memq_env
from tests.support.openai_server import ScriptedOpenAI
from tests.support.scenarios import document_of, stack_settings
from tests.support.serve import Keys, bearer
from tests.support.waiting import wait_for

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

WHO = "auth0|abc"  # a real id: a provider subject
MUNICH = Teach("User lives in Munich", said="Munich", role="user")
BERLIN = Teach("User lives in Berlin", said="Berlin", role="user")
TEA = Teach("User drinks oolong tea", said="oolong", role="user")
SECRET = Teach("User's secret project is Bluebird", said="Bluebird", role="user")


def turn(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}, {"role": "assistant", "content": "Noted."}]


def facts_of(settings: MemqSettings) -> dict[str, str]:
    return {f.content: f.id for f in document_of(settings, WHO).facts}


def test_why_superseded_and_forget_a_thread_over_http(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    serve_for: Any,
    producer_for: Any,
    redis_client: Any,
) -> None:
    settings = stack_settings(make_settings, openai_server, storage="redis")
    env = memq_env(settings)
    celery_procs.start_worker(env, concurrency=2, pool="threads")
    celery_procs.start_beat(env)
    server = serve_for(settings)
    producer = producer_for(settings)
    keys = Keys()
    user = f"/v1/users/{path_segment(WHO)}"

    openai_server.responder = CitingModel([MUNICH, TEA])
    assert producer.flush("t-home", WHO, None, turn("I live in Munich and drink oolong tea."))
    wait_for(lambda: len(facts_of(settings)) == 2, what="two facts from t-home")
    openai_server.responder = CitingModel([BERLIN, TEA, SECRET], contradicts=["Munich"])
    secret = "I moved to Berlin. My secret project is Bluebird; still oolong tea, <b>always</b>."
    assert producer.flush("t-secret", WHO, None, turn(secret))
    wait_for(lambda: "User lives in Berlin" in facts_of(settings), what="Berlin")
    ids = facts_of(settings)

    with httpx.Client(base_url=server.url, timeout=10, headers=bearer(keys.agent)) as http:
        why = http.get(f"{user}/facts/{ids['User lives in Berlin']}/why")
        assert why.status_code == 200, why.text
        body = why.json()
        assert body["status"] == "current"
        (source,) = body["sources"]
        assert (source["thread_id"], source["attribution"]) == ("t-secret", "message")
        assert source["excerpts"] == [secret]  # the user's own words, as said
        assert [e["fact"]["content"] for e in body["supersedes"]] == ["User lives in Munich"]
        assert [c["action"] for c in body["history"]] == ["add", "supersede", "add"]

        (old,) = http.get(f"{user}/superseded").json()["superseded"]
        assert (old["fact"]["content"], old["kind"]) == ("User lives in Munich", "contradicted")
        assert ids["User lives in Berlin"] in old["replaced_by"]  # (every fact its answer added)
        munich = http.get(f"{user}/facts/{old['fact']['id']}/why").json()
        assert munich["status"] == "superseded" and munich["superseded"]["thread_id"] == "t-secret"

        missing = http.get(f"{user}/facts/fact_00000000/why")
        assert missing.status_code == 404
        assert missing.headers["content-type"] == "application/problem+json"
        # Forgetting is the admin's: an agent key may read why, not erase.
        refused = http.delete(f"{user}/threads/t-secret")
        assert refused.status_code == 403
        assert "User lives in Berlin" in facts_of(settings)

    with httpx.Client(base_url=server.url, timeout=10, headers=bearer(keys.admin)) as http:
        forgot = http.delete(f"{user}/threads/t-secret")
        assert forgot.status_code == 200, forgot.text
        done = forgot.json()
        assert (done["user_id"], done["thread_id"]) == (WHO, "t-secret")
        # Berlin and Bluebird go; tea keeps t-home; Munich, learnt in t-home, stays superseded.
        assert done["removed"]["facts_removed"] == 2 and done["removed"]["facts_trimmed"] == 1
        assert sorted(facts_of(settings)) == ["User drinks oolong tea"]
        tea = http.get(f"{user}/facts/{ids['User drinks oolong tea']}/why").json()
        assert [s["thread_id"] for s in tea["sources"]] == ["t-home"]
        gone = http.get(f"{user}/facts/{ids['User lives in Berlin']}/why")
        assert gone.status_code == 404  # not even the history names it now
        again = http.delete(f"{user}/threads/t-secret")  # idempotent
        assert again.json()["removed"]["facts_removed"] == 0
        bad = http.delete(f"{user}/threads/{'x' * 5000}")
        assert bad.status_code == 422 and bad.headers["content-type"] == "application/problem+json"

    dump = {k: v for k, v in dump_redis(redis_client).items() if settings.key_prefix in k}
    assert [k for k, v in dump.items() if "Bluebird" in v or "always" in v] == []
    assert [k for k, v in dump.items() if "t-secret" in v or "t-secret" in k] == []
