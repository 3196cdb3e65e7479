"""FileMemoryStorage, what only it does: layout, cache, atomic writes, corrupt files, locks,
file modes (the shared contract is tests/test_storage_contract.py)."""

from __future__ import annotations

import fcntl
import json
import os
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from memq.core.errors import CorruptMemoryFile, LockTimeout, StorageError
from memq.core.settings import MemqSettings
from storage.base import Change, UpdateResult
from storage.document import Fact, MemoryDocument
from storage.files import FileMemoryStorage
from tests.support.documents import DEERFLOW_MEMORY_JSON, contents, doc_with


@pytest.fixture
def file_settings(tmp_path: Path) -> MemqSettings:
    return MemqSettings(
        storage="file", storage_dir=tmp_path / "memory", storage_lock_timeout_seconds=0.3
    )


@pytest.fixture
def store(file_settings: MemqSettings) -> FileMemoryStorage:
    return FileMemoryStorage(file_settings)


def test_storage_defaults_to_redis_and_file_paths_resolve_at_load(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    settings = MemqSettings(storage="file", storage_dir=Path("rel/memory"))
    assert MemqSettings().storage == "redis"
    assert settings.storage_dir == tmp_path / "rel" / "memory"
    assert settings.data_dir == tmp_path / ".memq"
    monkeypatch.chdir("/")  # a later change of directory no longer moves the folder
    assert FileMemoryStorage(settings).root == tmp_path / "rel" / "memory"


def test_round_trip_writes_memq_json_at_the_documented_paths(store: FileMemoryStorage) -> None:
    store.save("alice", None, doc_with("Likes tea"))
    store.save("alice", "Coder", doc_with("Uses vim"))

    root = store.root
    global_file = root / "users" / "alice" / "memory.json"
    agent_file = root / "users" / "alice" / "agents" / "coder" / "memory.json"
    assert json.loads(global_file.read_text("utf-8"))["facts"][0]["content"] == "Likes tea"
    data = json.loads(agent_file.read_text("utf-8"))
    assert data["facts"][0]["content"] == "Uses vim"
    assert "created_at" in data["facts"][0] and data["last_updated"]
    assert contents(store.load("alice")) == ["Likes tea"]
    assert contents(store.load("alice", "coder")) == ["Uses vim"]
    assert contents(store.load("alice", "CODER")) == ["Uses vim"]  # names are case-insensitive


@pytest.mark.parametrize(
    ("user", "agent"), [("../etc", None), ("a/b", None), ("alice", "../x"), ("alice", "a b")]
)
def test_path_like_identifiers_stay_one_folder_inside_the_root(
    store: FileMemoryStorage, user: str, agent: str | None
) -> None:
    store.save(user, agent, doc_with("x"))
    (saved,) = store.root.rglob("memory.json")
    assert saved == store.path(user, agent)
    inside = saved.relative_to(store.root / "users").parts
    assert len(inside) == (2 if agent is None else 4)
    assert [f.content for f in store.load(user, agent).facts] == ["x"]


def test_cache_sees_a_write_by_another_process(store: FileMemoryStorage) -> None:
    store.save("alice", None, doc_with("version A"))
    assert contents(store.load("alice")) == ["version A"]
    # Another storage instance stands for another process; same size, so only the inode tells.
    FileMemoryStorage(MemqSettings(storage_dir=store.root, storage_lock_timeout_seconds=1)).save(
        "alice", None, doc_with("version B")
    )
    assert contents(store.load("alice")) == ["version B"]


def test_an_update_under_the_lock_reads_the_bytes_not_a_trusted_signature(
    store: FileMemoryStorage,
) -> None:
    """The cache's parsed entry is reused under the lock only for the very bytes it was parsed
    from: a rewrite of the same size in place, with its modification time put back, is read."""
    store.save("alice", None, doc_with("version A"))
    path = store.path("alice")
    assert contents(store.load("alice")) == ["version A"]
    before = os.stat(path)
    data = path.read_bytes()
    with open(path, "r+b") as f:  # same inode, same size
        f.write(data.replace(b"version A", b"version B"))
    os.utime(path, ns=(before.st_atime_ns, before.st_mtime_ns))
    seen: list[list[str]] = []

    def fn(latest: MemoryDocument) -> MemoryDocument:
        seen.append(contents(latest))
        return latest

    store.update("alice", None, fn)
    assert seen == [["version B"]]


def test_what_an_update_returns_is_the_callers_own(store: FileMemoryStorage) -> None:
    store.save("alice", None, doc_with("kept"))

    def add(latest: MemoryDocument) -> MemoryDocument:
        latest.facts.append(Fact(content="added", confidence=0.8))
        return latest

    returned = store.update("alice", None, add)
    assert returned.last_updated is not None
    returned.facts.clear()
    returned.facts.append(Fact(content="not saved", confidence=0.8))
    assert contents(store.load("alice")) == ["kept", "added"]
    unchanged = store.update("alice", None, lambda latest: latest)
    unchanged.facts.clear()  # the nothing-changed path hands back the callback's object too
    assert contents(store.load("alice")) == ["kept", "added"]


def test_failed_write_raises_and_leaves_no_temp_file(store: FileMemoryStorage) -> None:
    target = store.path("alice", None)
    (target / "blocker").mkdir(parents=True)  # a non-empty folder where the file should go

    with pytest.raises(StorageError):
        store.save("alice", None, doc_with("x"))
    assert [p.name for p in target.parent.iterdir() if p.name.endswith(".tmp")] == []


def test_save_replaces_atomically_and_leaves_only_the_document(store: FileMemoryStorage) -> None:
    store.save("alice", None, doc_with("one"))
    before = os.stat(store.path("alice")).st_ino
    store.save("alice", None, doc_with("two"))
    assert os.stat(store.path("alice")).st_ino != before  # replaced, never rewritten in place
    names = sorted(p.name for p in store.path("alice").parent.iterdir())
    assert names == ["memory.json", "memory.json.lock"]


def test_corrupt_file_raises_is_moved_aside_and_never_overwritten(
    store: FileMemoryStorage,
) -> None:
    path = store.path("alice", "coder")
    path.parent.mkdir(parents=True)
    path.write_text('{"facts": [{"content": "precious", ', encoding="utf-8")

    with pytest.raises(CorruptMemoryFile, match="moved aside"):
        store.load("alice", "coder")
    aside = list(path.parent.glob("memory.json.corrupt-*"))
    assert len(aside) == 1
    assert "precious" in aside[0].read_text("utf-8")
    assert not path.exists()

    # The next update starts a new document; the corrupt copy is kept untouched.
    store.update("alice", "coder", lambda d: doc_with("new"))
    assert contents(store.load("alice", "coder")) == ["new"]
    assert "precious" in aside[0].read_text("utf-8")


def test_update_on_a_corrupt_file_raises_instead_of_writing(store: FileMemoryStorage) -> None:
    path = store.path("alice")
    path.parent.mkdir(parents=True)
    path.write_text("[1, 2, 3]", encoding="utf-8")  # valid JSON, not a document

    with pytest.raises(CorruptMemoryFile):
        store.update("alice", None, lambda d: doc_with("would erase"))
    assert not path.exists()
    assert len(list(path.parent.glob("memory.json.corrupt-*"))) == 1


def test_reads_a_deerflow_memory_json(store: FileMemoryStorage) -> None:
    path = store.path("alice")
    path.parent.mkdir(parents=True)
    path.write_text(DEERFLOW_MEMORY_JSON, encoding="utf-8")

    document = store.load("alice")
    assert document.user.work_context.summary.startswith("Backend engineer at Acme")
    uv, make_dev, stack = document.facts
    assert (uv.id, uv.category, uv.confidence) == ("fact_3f9a1c2e", "preference", 0.9)
    assert (uv.source, uv.source_thread_id) == ("conversation", "thread-42")
    assert make_dev.source_error == "The agent suggested npm start"
    assert stack.source == "consolidation" and stack.consolidated_from == ["fact_a1", "fact_b2"]

    store.update("alice", None, lambda d: d)  # unchanged: the DeerFlow file is left as it was
    assert "lastUpdated" in path.read_text("utf-8")
    store.save("alice", None, document)
    saved = json.loads(path.read_text("utf-8"))
    assert saved["facts"][0]["source_thread_id"] == "thread-42"
    assert "user" in saved and "work_context" in saved["user"]


def _set(path: tuple[str | int, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def patch(data: dict[str, Any]) -> None:
        target: Any = data
        for step in path[:-1]:
            target = target[step]
        target[path[-1]] = value

    return patch


@pytest.mark.parametrize(
    "patch",
    [
        _set(("user", "topOfMind"), None),
        _set(("user", "personalContext"), ["not", "an", "object"]),
        _set(("history",), None),
        _set(("history", "recentMonths"), 42),
        _set(("facts", 2, "id"), "f" * 200),
        _set(("facts", 2, "id"), ""),
        _set(("facts", 2, "source_thread_id"), 7),
    ],
    ids=[
        "null-section",
        "list-section",
        "null-group",
        "number-section",
        "long-id",
        "blank-id",
        "numeric-thread",
    ],
)
def test_one_sloppy_value_is_repaired_and_the_memory_kept(
    store: FileMemoryStorage, patch: Callable[[dict[str, Any]], None]
) -> None:
    data = json.loads(DEERFLOW_MEMORY_JSON)
    patch(data)
    path = store.path("alice")
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(data), encoding="utf-8")

    document = store.load("alice")
    assert document.user.work_context.summary.startswith("Backend engineer at Acme")
    assert contents(document)[:2] == [
        "Uses uv instead of pip for Python projects",
        "Run the app with make dev",
    ]
    assert len(document.facts) == 3 and len({f.id for f in document.facts}) == 3
    assert all(0 < len(f.id) <= 128 for f in document.facts)
    # The next extraction builds on the whole memory; nothing was moved aside.
    store.update(
        "alice", None, lambda d: d.model_copy(update={"facts": [*d.facts, Fact(content="new")]})
    )
    assert len(store.load("alice").facts) == 4
    assert not list(path.parent.glob("memory.json.corrupt-*"))


def test_null_user_and_non_list_facts_read_as_empty_parts(store: FileMemoryStorage) -> None:
    path = store.path("alice")
    path.parent.mkdir(parents=True)
    path.write_text(
        json.dumps(
            {
                "user": None,
                "history": {"earlierContext": {"summary": "Lived in Oslo"}},
                "facts": {"oops": 1},
            }
        ),
        encoding="utf-8",
    )
    document = store.load("alice")
    assert document.history.earlier_context.summary == "Lived in Oslo"
    assert document.facts == [] and document.user.work_context.summary == ""
    assert not list(path.parent.glob("memory.json.corrupt-*"))


def test_update_records_history_newest_first_and_bounded(tmp_path: Path) -> None:
    store = FileMemoryStorage(MemqSettings(storage_dir=tmp_path, history_max_entries=3))
    for i in range(5):

        def add(document: MemoryDocument, i: int = i) -> UpdateResult:
            document.facts.append(Fact(content=f"fact {i}"))
            change = Change(action="add", content=f"fact {i}", source_thread_id="t1")
            return UpdateResult(document, [change])

        store.update("alice", "coder", add)

    history = store.history("alice", "coder")
    assert [c.content for c in history] == ["fact 4", "fact 3", "fact 2"]
    assert history[0].source_thread_id == "t1"
    assert store.history("alice", "coder", limit=1)[0].content == "fact 4"
    sidecar = store.path("alice", "coder").with_name("memory.history.jsonl")
    assert len(sidecar.read_text("utf-8").splitlines()) == 3  # trimmed on disk too


def test_update_times_out_while_another_process_holds_the_lock(
    store: FileMemoryStorage,
) -> None:
    store.save("alice", None, doc_with("x"))
    lock_path = store.path("alice").with_name("memory.json.lock")
    with open(lock_path, "a") as held:
        fcntl.flock(held.fileno(), fcntl.LOCK_EX)
        with pytest.raises(LockTimeout):
            store.update("alice", None, lambda d: doc_with("y"))
    assert contents(store.load("alice")) == ["x"]
    store.update("alice", None, lambda d: doc_with("y"))  # released: works again
    assert contents(store.load("alice")) == ["y"]


def test_a_waiter_gets_the_lock_from_a_holder_that_relocks_at_once(tmp_path: Path) -> None:
    """A holder that takes the lock again right after releasing it must not starve a waiter
    (a poller that sleeps between tries almost never lands in the gap)."""
    settings = MemqSettings(storage_dir=tmp_path / "memory", storage_lock_timeout_seconds=5)
    holder, waiter = FileMemoryStorage(settings), FileMemoryStorage(settings)
    stop = threading.Event()

    def hold(document: MemoryDocument) -> MemoryDocument:
        stop.wait(0.02)  # a slow update, with the lock held
        return document  # unchanged: nothing written

    def hold_again_and_again() -> None:
        while not stop.is_set():
            holder.update("alice", None, hold)

    thread = threading.Thread(target=hold_again_and_again)
    thread.start()
    waits: list[float] = []
    try:
        for i in range(5):

            def add(document: MemoryDocument, i: int = i) -> MemoryDocument:
                return MemoryDocument(facts=[*document.facts, Fact(content=f"f{i}")])

            started = time.monotonic()
            waiter.update("alice", None, add)
            waits.append(time.monotonic() - started)
    finally:
        stop.set()
        thread.join(10)
    assert contents(waiter.load("alice")) == [f"f{i}" for i in range(5)]
    assert max(waits) < 1.0, waits  # a few hold periods at most, not the 5 s timeout


def test_delete_removes_everything_of_that_agent(store: FileMemoryStorage) -> None:
    store.save("alice", "coder", doc_with("x"), changes=[Change(action="add", content="x")])
    store.save("alice", None, doc_with("global"))

    assert store.delete("alice", "coder") is True
    assert not (store.root / "users" / "alice" / "agents").exists()
    assert store.list_agents("alice") == [None]
    assert store.history("alice", "coder") == []
    assert store.delete("alice", "coder") is False
    assert store.delete("alice", None) is True
    assert not (store.root / "users" / "alice").exists()
    assert store.list_users() == []


def test_a_fenced_save_of_an_overtaken_claim_is_refused(tmp_path: Path) -> None:
    """The fence file only moves forward: once a newer claim of a context registered, a save by
    an older one writes nothing, even with no queue to ask."""
    from memq.core.errors import StaleClaim
    from memq.core.settings import load_settings
    from storage.base import Fence

    storage = FileMemoryStorage(load_settings(storage_dir=tmp_path))
    storage.fence_run("amy", None, Fence("t:amy:", "7"))
    with pytest.raises(StaleClaim):
        storage.update("amy", None, lambda d: _with_fact(d, "old run"), fence=Fence("t:amy:", "6"))
    assert storage.load("amy").facts == []
    storage.update("amy", None, lambda d: _with_fact(d, "new run"), fence=Fence("t:amy:", "7"))
    assert [f.content for f in storage.load("amy").facts] == ["new run"]
    with pytest.raises(StaleClaim):  # an older claim cannot register after a newer one either
        storage.fence_run("amy", None, Fence("t:amy:", "5"))
    storage.delete("amy", None)
    assert not storage.directory("amy", None).exists()  # the fence file goes with the memory


def _with_fact(document: Any, content: str) -> Any:
    from storage.document import Fact

    document.facts.append(Fact(content=content))
    return document


def test_the_document_cache_is_bounded_and_drops_the_least_recently_used(tmp_path: Path) -> None:
    from memq.core.settings import load_settings
    from storage.document import Fact, MemoryDocument

    storage = FileMemoryStorage(load_settings(storage_dir=tmp_path, storage_cache_max_documents=3))
    for n in range(5):
        storage.save(f"u{n}", None, MemoryDocument(facts=[Fact(content=f"fact {n}")]))
    assert len(storage._cache) == 3
    storage.load("u2")  # used: kept over u3 when the next one comes in
    storage.load("u0")  # read from disk again, into the cache
    cached = {path.parent.name for path in storage._cache}
    assert cached == {"u2", "u4", "u0"}
    assert [f.content for f in storage.load("u3").facts] == ["fact 3"]  # evicted, still correct


def test_folders_are_0700_and_files_0600_whatever_the_umask(tmp_path: Path) -> None:
    """Memory documents hold what users told their agents: only the owner may read them, also
    when the storage is used outside `memq up` (whose data folder is private already)."""
    from memq.core.settings import load_settings
    from storage.base import Fence

    old = os.umask(0o022)
    try:
        root = tmp_path / "fresh" / "store"
        storage = FileMemoryStorage(load_settings(storage_dir=root, history_max_entries=2))
        for i in range(4):  # enough history lines to trim by a rewrite
            storage.update(
                "alice@example.com",
                "coder",
                lambda d, i=i: UpdateResult(
                    _with_fact(d, f"fact {i}"), [Change(action="add", content=f"fact {i}")]
                ),
                fence=Fence("t:alice%40example%2Ecom:coder", str(i + 1)),
            )
        storage.save(None, None, _with_fact(MemoryDocument(), "anonymous"))
    finally:
        os.umask(old)
    names = {p.name for p in root.rglob("*")}
    assert {"memory.json", "memory.history.jsonl", "memory.json.lock"} <= names
    assert "memory.fence.json" in names
    for path in [root, *root.rglob("*")]:
        mode = path.stat().st_mode & 0o777
        assert mode == (0o700 if path.is_dir() else 0o600), f"{path.relative_to(tmp_path)}"
