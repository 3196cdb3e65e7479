"""The storage contract, run against every backend of the registry (as dramatiq runs its result
backends through one ``result_backend`` fixture): what a caller of :class:`MemoryStorage` may rely
on whichever backend is configured. Each backend is built by its own registry factory from the
settings and the deployment's Redis client; backend-specific behaviour (file layout, Redis keys,
locks, corrupt data on disk) stays in tests/test_storage_file.py and tests/test_storage_redis.py.

The in-memory double of the algorithm tests (tests/support/memory_storage.py) runs the same
contract, so a test that passes on it would pass on a real backend; only fencing against the queue
(it has no queue behind it) is checked on the real backends alone."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import redis

from memq.core.errors import InvalidIdentifier, StaleClaim
from memq.core.identity import ContextKey
from memq.core.settings import MemqSettings
from producer.enqueue import Enqueuer, EnqueueRequest
from storage import get_storage
from storage.backends import BACKENDS, backend_for
from storage.base import Change, Fence, MemoryStorage, SharedReads, UpdateResult
from storage.document import Fact, MemoryDocument
from tests.support.documents import contents, doc_with
from tests.support.memory_storage import InMemoryStorage
from tests.support.started_queue import StartingQueue
from worker.queue import QueueClient

T0 = 1_700_000_000_000


IN_MEMORY = "in-memory"  # the test double, beside the registry's backends


@pytest.fixture(params=sorted(BACKENDS))
def backend_settings(request: pytest.FixtureRequest, make_settings: Any) -> MemqSettings:
    return make_settings(storage=request.param, history_max_entries=3)  # type: ignore[no-any-return]


def _opened(settings: MemqSettings, client: redis.Redis) -> Iterator[MemoryStorage]:
    storage = backend_for(settings).open(settings, client)
    yield storage
    close = getattr(storage, "close", None)
    if close is not None:
        close()


@pytest.fixture
def backend_store(
    backend_settings: MemqSettings, redis_client: redis.Redis
) -> Iterator[MemoryStorage]:
    """A real backend of the registry (what fences against the queue)."""
    yield from _opened(backend_settings, redis_client)


@pytest.fixture(params=[*sorted(BACKENDS), IN_MEMORY])
def store(
    request: pytest.FixtureRequest, make_settings: Any, redis_client: redis.Redis
) -> Iterator[MemoryStorage]:
    """Every backend of the registry, and the in-memory double."""
    settings: MemqSettings = make_settings(
        storage="file" if request.param == IN_MEMORY else request.param, history_max_entries=3
    )
    if request.param == IN_MEMORY:
        yield InMemoryStorage(settings)
    else:
        yield from _opened(settings, redis_client)


def test_the_registry_names_exactly_the_backends_the_setting_accepts() -> None:
    choices = MemqSettings.model_fields["storage"].annotation
    assert set(BACKENDS) == set(choices.__args__)  # type: ignore[union-attr]
    for name, backend in BACKENDS.items():
        assert backend.name == name and backend.claims_checked_against


def test_get_storage_builds_the_backend_the_settings_name(backend_settings: MemqSettings) -> None:
    built = get_storage(backend_settings)
    reference = backend_for(backend_settings).open(backend_settings, None)
    assert type(built) is type(reference)


def test_round_trip_and_case_insensitive_agent_names(store: MemoryStorage) -> None:
    store.save("alice", None, doc_with("Likes tea"))
    store.save("alice", "Coder", doc_with("Uses vim"))
    assert contents(store.load("alice")) == ["Likes tea"]
    loaded = store.load("alice", "CODER")
    assert contents(loaded) == ["Uses vim"] and loaded.last_updated is not None
    assert store.load("nobody").facts == []


def test_documents_are_isolated_per_user_and_agent(store: MemoryStorage) -> None:
    store.save("alice", "coder", doc_with("alice coder"))
    store.save("bob", "coder", doc_with("bob coder"))
    store.save("alice", None, doc_with("alice global"))
    assert contents(store.load("alice", "coder")) == ["alice coder"]
    assert contents(store.load("bob", "coder")) == ["bob coder"]
    assert contents(store.load("alice")) == ["alice global"]
    assert store.load("bob").facts == [] and store.load("carol", "coder").facts == []
    assert store.list_users() == ["alice", "bob"]
    assert store.list_agents("alice") == [None, "coder"]


HOSTILE_IDS = [
    ("alice@example.com", None),
    ("auth0|abc", "x.y"),
    ("../etc", None),
    ("a}:x", "{evil}"),
    ("a b", "../x"),
    ("用户", "助手"),
    ("default", None),
]


def test_any_printable_id_is_its_own_document(store: MemoryStorage) -> None:
    for user, agent in HOSTILE_IDS:
        store.save(user, agent, doc_with(f"{user} {agent}"))
    for user, agent in HOSTILE_IDS:
        assert contents(store.load(user, agent)) == [f"{user} {agent}"]
    assert set(store.list_users()) == {user for user, _ in HOSTILE_IDS}
    assert store.list_agents("auth0|abc") == ["x.y"]
    assert store.load(None).facts == []  # the anonymous user is not the literal "default"


@pytest.mark.parametrize(("user", "agent"), [("", None), ("a\x00b", None), ("alice", "a\nb")])
def test_unsafe_identifiers_are_refused(store: MemoryStorage, user: str, agent: str | None) -> None:
    with pytest.raises(InvalidIdentifier):
        store.save(user, agent, doc_with("x"))
    assert store.list_users() == []


def test_neither_save_nor_load_shares_the_callers_objects(store: MemoryStorage) -> None:
    document = doc_with("Likes tea")
    store.save("alice", None, document)
    assert document.last_updated is None  # the caller's document is not stamped
    first = store.load("alice")
    first.facts.clear()
    first.user.work_context.summary = "mutated"
    again = store.load("alice")
    assert contents(again) == ["Likes tea"] and again.user.work_context.summary == ""


def test_a_view_is_the_stored_document_itself_and_never_a_stale_one(
    backend_store: MemoryStorage,
) -> None:
    # What a reader that only looks gets (the injector, every turn): the backend's own parse of
    # the stored document, not a copy, and never an older one than a load would give.
    assert isinstance(backend_store, SharedReads)
    backend_store.save("alice", None, doc_with("Likes tea"))
    view = backend_store.view("alice")
    assert contents(view) == ["Likes tea"] and backend_store.view("alice") is view
    loaded = backend_store.load("alice")
    assert loaded is not view and loaded.model_dump() == view.model_dump()
    loaded.facts.clear()  # a load's private copy never reaches a view
    assert contents(backend_store.view("alice")) == ["Likes tea"]
    backend_store.save("alice", None, doc_with("Likes coffee"))
    assert contents(backend_store.view("alice")) == ["Likes coffee"]
    assert backend_store.view("alice", "coder").facts == []


def test_update_applies_to_the_latest_document_and_records_history_newest_first(
    store: MemoryStorage,
) -> None:
    store.save("alice", "coder", doc_with("seed"))
    for i in range(5):

        def add(document: MemoryDocument, i: int = i) -> UpdateResult:
            document.facts.append(Fact(content=f"fact {i}"))
            return UpdateResult(document, [Change(action="add", content=f"fact {i}")])

        store.update("alice", "coder", add)
    assert contents(store.load("alice", "coder")) == ["seed", *(f"fact {i}" for i in range(5))]
    history = store.history("alice", "coder", limit=10)
    assert [c.content for c in history] == ["fact 4", "fact 3", "fact 2"]  # bounded to 3
    assert [c.content for c in store.history("alice", "coder", limit=1)] == ["fact 4"]


def test_an_update_that_changes_nothing_writes_nothing(store: MemoryStorage) -> None:
    store.save("alice", None, doc_with("x"))
    stamped = store.load("alice").last_updated
    store.update("alice", None, lambda document: document)
    assert store.load("alice").last_updated == stamped and store.history("alice") == []


def test_delete_removes_document_history_and_listing(store: MemoryStorage) -> None:
    store.save("alice", "coder", doc_with("x"), changes=[Change(action="add", content="x")])
    store.save("alice", None, doc_with("global"))
    assert store.delete("alice", "coder") is True
    assert store.load("alice", "coder").facts == [] and store.history("alice", "coder") == []
    assert store.list_agents("alice") == [None]
    assert store.delete("alice", "coder") is False
    assert store.delete("alice", None) is True
    assert store.list_users() == []


def _claim(settings: MemqSettings, client: redis.Redis, now: int) -> tuple[QueueClient, Fence]:
    queue = StartingQueue(settings, client)
    key = ContextKey.create("t-1", "amy", None)
    Enqueuer(client, queue.keys, debounce_ms=0, max_delay_ms=0)(
        EnqueueRequest(key=key, messages_json=json.dumps([{"role": "user", "content": "hi"}])),
        now,
    )
    (claim,) = queue.claim(now).claims
    return queue, Fence(claim.context_id, claim.token)


def _add(content: str) -> Any:
    def add(document: MemoryDocument) -> MemoryDocument:
        document.facts.append(Fact(content=content))
        return document

    return add


def test_only_the_current_claim_of_the_queue_writes(
    backend_store: MemoryStorage, backend_settings: MemqSettings, redis_client: redis.Redis
) -> None:
    store = backend_store
    queue, old = _claim(backend_settings, redis_client, T0)
    store.fence_run("amy", None, old)
    queue.reap(T0 + 10 * 60_000)  # the old run's lease ran out: the context is due again
    (claim,) = queue.claim(T0 + 10 * 60_000).claims
    with pytest.raises(StaleClaim):
        store.update("amy", None, _add("from the old claim"), fence=old)
    current = Fence(claim.context_id, claim.token)
    store.fence_run("amy", None, current)
    store.update("amy", None, _add("from the current claim"), fence=current)
    assert contents(store.load("amy")) == ["from the current claim"]


def test_a_storage_built_without_a_client_still_fences_its_saves(
    backend_settings: MemqSettings, redis_client: redis.Redis
) -> None:
    """`get_storage(settings)` alone: the backend reaches the deployment's Redis by itself when a
    fenced save needs the queue, never writing on a claim it cannot check."""
    storage = get_storage(backend_settings)
    queue, fence = _claim(backend_settings, redis_client, T0)
    storage.fence_run("amy", None, fence)
    queue.release(fence.context_id, fence.token, T0 + 1)  # the claim is given back
    with pytest.raises(StaleClaim):
        storage.update("amy", None, _add("unchecked"), fence=fence)
    assert storage.load("amy").facts == []
