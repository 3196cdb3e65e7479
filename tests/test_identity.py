from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from memq.core.errors import InvalidIdentifier
from memq.core.identity import ANONYMOUS_USER_ID, ContextKey, validate_agent_name, validate_user_id
from memq.core.keys import KeySchema


@given(
    thread=st.text(min_size=1, max_size=80).filter(lambda s: bool(s.strip()) and s.isprintable()),
    user=st.text(min_size=1, max_size=40).filter(lambda s: bool(s.strip()) and s.isprintable()),
    agent=st.none()
    | st.text(min_size=1, max_size=20).filter(lambda s: bool(s.strip()) and s.isprintable()),
)
def test_context_id_round_trips_and_never_leaks_separators(
    thread: str, user: str, agent: str | None
) -> None:
    key = ContextKey.create(thread, user, agent)
    assert key.id.count(":") == 2
    assert "{" not in key.id and "}" not in key.id
    assert ContextKey.from_id(key.id) == key


def test_same_thread_different_user_or_agent_are_different_contexts() -> None:
    a = ContextKey.create("t1", "alice", "coder")
    assert a.id != ContextKey.create("t1", "bob", "coder").id
    assert a.id != ContextKey.create("t1", "alice", None).id
    assert a.id != ContextKey.create("t1", "alice", "writer").id


@pytest.mark.parametrize("bad", ["", "  ", "a" * 300, "a\x00", "a\tb", "\ud800"])
def test_bad_user_ids_are_typed_errors(bad: str) -> None:
    with pytest.raises(InvalidIdentifier):
        validate_user_id(bad)


@pytest.mark.parametrize("bad", ["", " ", "a\nb", "a\u200bb", "a" * 200])
def test_bad_agent_names_are_typed_errors(bad: str) -> None:
    with pytest.raises(InvalidIdentifier):
        validate_agent_name(bad)


def test_agent_names_are_case_insensitive_and_none_is_user_global() -> None:
    assert validate_agent_name("MyAgent") == "myagent"
    assert validate_user_id(None) == ANONYMOUS_USER_ID


@pytest.mark.parametrize("bad", ["", "  ", "a\x00b", "t" * 600, 5])
def test_bad_thread_ids_are_typed_errors(bad: object) -> None:
    with pytest.raises(InvalidIdentifier):
        ContextKey.create(bad, "u", None)


def test_queue_keys_of_one_shard_share_a_hash_tag() -> None:
    keys = KeySchema("memq", 1)
    q = keys.for_context("t:u:")
    for name in (q.due, q.inflight, q.dead, q.context("t:u:")):
        assert name.startswith("memq:{memq:0}:")
    many = KeySchema("memq", 8)
    assert {many.shard_of(f"t:u{i}:") for i in range(100)} == set(range(8))


def test_a_context_and_its_memory_document_share_a_shard() -> None:
    """The fenced save checks the context's claim in the same script as the document write, so
    every thread of one (user, agent) and that memory live under one hash tag."""
    keys = KeySchema("memq", 64)
    for user in ("alice", "bob", "u-17"):
        for agent in ("coder", None):
            doc = keys.memory_document(user, agent)
            tags = {
                keys.for_context(f"thread-{i}:{user}:{agent or ''}").tag.split("{")[1]
                for i in range(20)
            }
            assert len(tags) == 1
            assert doc.split("{")[1].split("}")[0] + "}" == tags.pop()
