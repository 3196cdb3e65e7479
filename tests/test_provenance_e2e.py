"""Provenance end to end: a real `celery worker` and `celery beat`, the real `openai` client and a
scripted model that cites (rightly, wrongly, not at all). Every fact says where it came from, a
repeated fact is confirmed, assistant-only facts are refused, a contradicted fact is superseded
(visible in `memq why` and the management API, never injected), and forgetting a thread removes
its text from Redis — even with a run of that thread in flight."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
from typing import Any

import pytest

from memq.core.models import Message
from memq.core.settings import MemqSettings
from memq.testing.openai_server import CitingModel, Teach
from memq.testing.redis_dump import dump_redis
from memq.testing.waiting import DEADLINE_SECONDS, wait_for
from producer.injector import MemoryInjector
from prompts.update_prompt import PROMPT_VERSION
from storage import get_storage
from storage.document import Fact
from storage.management import MemoryManager
from tests.support.celery_procs import REPO_ROOT, CeleryProcs, memq_env
from tests.support.openai_server import ScriptedOpenAI
from tests.support.scenarios import document_of, queue_idle, stack_settings
from worker.queue import QueueClient
from worker.watermark import message_identity

pytestmark = [pytest.mark.e2e, pytest.mark.integration]

SAID = "I live in Munich and I drink oolong tea. I play chess on Sundays."
MUNICH = Teach("User lives in Munich", said="I live in Munich", role="user")
OOLONG_WRONG = Teach("User drinks oolong tea", said="oolong", cite="wrong")
CHESS_UNCITED = Teach("User plays chess on Sundays", said="chess", cite="none")
MISO = Teach("User has a cat called Miso", said="Miso")


def user(text: str) -> dict[str, str]:
    return {"role": "user", "content": text}


def assistant(text: str) -> dict[str, str]:
    return {"role": "assistant", "content": text}


def fact_named(settings: MemqSettings, who: str, content: str) -> Fact | None:
    return next((f for f in document_of(settings, who).facts if f.content == content), None)


def cli(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, "-m", "memq.cli", *args],
        cwd=REPO_ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=DEADLINE_SECONDS,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    return done


@pytest.fixture
def stack(
    make_settings: Any, openai_server: ScriptedOpenAI, celery_procs: CeleryProcs
) -> tuple[MemqSettings, dict[str, str]]:
    settings = stack_settings(make_settings, openai_server, storage="redis")
    env = memq_env(settings)
    celery_procs.start_worker(env, concurrency=2, pool="threads")
    celery_procs.start_beat(env)
    return settings, env


def test_citations_confirmations_grounding_and_supersession(
    stack: tuple[MemqSettings, dict[str, str]],
    openai_server: ScriptedOpenAI,
    producer_for: Any,
    redis_client: Any,
) -> None:
    settings, env = stack
    producer = producer_for(settings)
    queue = QueueClient(settings, redis_client)

    # 1. A right citation is stored as such; a wrong or a missing one falls back to the run.
    openai_server.responder = CitingModel([MUNICH, OOLONG_WRONG, CHESS_UNCITED])
    assert producer.flush("t-munich", "alice", None, [user(SAID), assistant("Noted!")])
    wait_for(lambda: len(document_of(settings, "alice").facts) == 3, what="3 facts")
    munich = fact_named(settings, "alice", "User lives in Munich")
    assert munich is not None
    (source,) = munich.sources
    assert source.attribution == "message" and source.thread_id == "t-munich"
    assert source.messages == (message_identity(Message("user", SAID)),)
    assert source.roles == ("user",)
    assert source.excerpts == (SAID,)  # the message it came from, for the inspector to show
    assert source.run_id and source.at is not None and source.model
    assert source.prompt_version == PROMPT_VERSION
    both = (
        message_identity(Message("user", SAID)),
        message_identity(Message("assistant", "Noted!")),
    )
    for content in ("User drinks oolong tea", "User plays chess on Sundays"):
        fact = fact_named(settings, "alice", content)
        assert fact is not None
        (fallback,) = fact.sources
        assert (fallback.attribution, fallback.messages) == ("run", both), content
        assert fallback.excerpts == ()  # no message is guessed, none is quoted
        assert fallback.roles == ("user", "assistant")

    # 2. Learning the same fact again, in another thread, adds a source and a confirmation.
    openai_server.responder = CitingModel([Teach("User drinks oolong tea", said="oolong")])
    assert producer.flush(
        "t-again", "alice", None, [user("As I said, oolong tea every day."), assistant("Enjoy!")]
    )

    def confirmed() -> bool:
        fact = fact_named(settings, "alice", "User drinks oolong tea")
        return fact is not None and fact.confirmations == 1

    wait_for(confirmed, what="the confirmation")
    oolong = fact_named(settings, "alice", "User drinks oolong tea")
    assert oolong is not None
    assert [(s.thread_id, s.attribution) for s in oolong.sources] == [
        ("t-munich", "run"),
        ("t-again", "message"),
    ]

    # 3. What only the assistant said is refused; once the user confirms it, it is kept.
    openai_server.responder = CitingModel([MISO])
    calls = openai_server.call_count
    echo = [user("What do you remember about my pets?"), assistant("You have a cat called Miso.")]
    assert producer.flush("t-echo", "alice", None, echo)
    wait_for(lambda: openai_server.call_count > calls and queue_idle(queue))
    assert fact_named(settings, "alice", MISO.content) is None
    wait_for(lambda: queue.stats()["facts_refused"] == 1)
    confirm = [*echo, user("Yes, exactly: Miso is my cat."), assistant("Lovely.")]
    assert producer.flush("t-echo", "alice", None, confirm)
    wait_for(lambda: fact_named(settings, "alice", MISO.content) is not None)
    miso = fact_named(settings, "alice", MISO.content)
    assert miso is not None and "user" in miso.sources[0].roles

    # 4. Munich → Berlin: Berlin injected, Munich superseded, both visible in `why` and the API.
    berlin_rule = Teach("User lives in Berlin", said="Berlin", role="user")
    openai_server.responder = CitingModel([berlin_rule], contradicts=["Munich"])
    moved = [user("I moved from Munich to Berlin last month."), assistant("Welcome!")]
    assert producer.flush("t-move", "alice", None, moved)
    wait_for(lambda: fact_named(settings, "alice", "User lives in Berlin") is not None)
    berlin = fact_named(settings, "alice", "User lives in Berlin")
    assert berlin is not None
    assert fact_named(settings, "alice", "User lives in Munich") is None
    block = MemoryInjector(settings).block("alice")
    assert "Berlin" in block and "Munich" not in block
    api = MemoryManager(get_storage(settings))
    (old,) = api.superseded("alice")
    assert (old.fact.id, old.kind, old.replaced_by) == (munich.id, "contradicted", [berlin.id])
    assert old.fact.sources == munich.sources and old.superseded_at is not None
    why_munich = api.why("alice", munich.id)
    assert why_munich.status == "superseded"
    assert [c.action for c in why_munich.history] == ["add", "supersede"]
    why_berlin = json.loads(cli(env, "why", "alice", berlin.id, "--json").stdout)
    assert why_berlin["status"] == "current"
    assert [e["fact"]["content"] for e in why_berlin["supersedes"]] == ["User lives in Munich"]
    assert [(c["action"], c["fact_id"]) for c in why_berlin["history"]] == [
        ("add", munich.id),
        ("supersede", munich.id),
        ("add", berlin.id),
    ]
    text = cli(env, "why", "alice", munich.id).stdout
    assert "superseded (contradicted)" in text and berlin.id in text and "t-munich" in text
    assert f"t-munich said: {SAID}" in text
    export = api.export("alice")
    assert [e["fact"]["content"] for e in export["superseded"]] == ["User lives in Munich"]


def test_forget_a_thread_with_a_run_of_it_in_flight(
    stack: tuple[MemqSettings, dict[str, str]],
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    producer_for: Any,
    redis_client: Any,
) -> None:
    settings, env = stack
    producer = producer_for(settings)
    oolong = Teach("User drinks oolong tea", said="oolong", role="user")
    acme = Teach("User works at Acme Robotics", said="Acme", role="user")
    bluebird = Teach("User's secret project is Bluebird", said="Bluebird", role="user")
    openai_server.responder = CitingModel([oolong, acme, bluebird])
    assert producer.flush(
        "t-keep", "ken", None, [user("I drink oolong tea. I work at Acme."), assistant("Ok.")]
    )
    wait_for(lambda: len(document_of(settings, "ken").facts) == 2, what="t-keep")
    secret = [user("My secret project is Bluebird. I drink oolong tea too."), assistant("Ok.")]
    assert producer.flush("t-secret", "ken", None, secret)
    wait_for(lambda: len(document_of(settings, "ken").facts) == 3, what="t-secret")
    shared = fact_named(settings, "ken", oolong.content)
    assert shared is not None and shared.confirmations == 1

    # A second run of the thread is in flight (its model answers once it is forgotten).
    answer = threading.Event()
    openai_server.responder = CitingModel([bluebird], release=answer)
    calls = openai_server.call_count
    more = [*secret, user("Bluebird launches in March, at Bluebird Labs."), assistant("Ok.")]
    assert producer.flush("t-secret", "ken", None, more)
    wait_for(lambda: openai_server.call_count > calls, what="the run in flight")
    forgot = cli(env, "forget", "ken", "--thread", "t-secret", "--json")
    answer.set()
    done = json.loads(forgot.stdout)
    removed = done["removed"]
    assert (removed["facts_removed"], removed["facts_trimmed"], removed["in_flight"]) == (1, 1, 1)
    wait_for(
        lambda: "outcome=stale answer discarded" in celery_procs.logs(),
        what="the in-flight run discarded",
    )

    facts = {f.content: f for f in document_of(settings, "ken").facts}
    assert sorted(facts) == ["User drinks oolong tea", "User works at Acme Robotics"]
    kept = facts["User drinks oolong tea"]
    assert [s.thread_id for s in kept.sources] == ["t-keep"] and kept.confirmations == 0
    dump = {k: v for k, v in dump_redis(redis_client).items() if settings.key_prefix in k}
    assert [k for k, v in dump.items() if "Bluebird" in v or "secret project" in v] == []
    assert [k for k, v in dump.items() if "t-secret" in v or "t-secret" in k] == []
    assert [k for k, v in dump.items() if "oolong tea too" in v] == []  # the confirming excerpt
    history = MemoryManager(get_storage(settings)).history("ken")
    assert history[0].action == "forget"
    assert all(c.source_thread_id != "t-secret" for c in history)
