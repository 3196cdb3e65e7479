"""Real-world ids (e-mail addresses, ``auth0|…``, dotted ids) are stored, reversibly and without
collisions, in Redis keys and file names; control characters, blanks and lone surrogates are
refused with a typed error; the anonymous user and the literal ``"default"`` are two users."""

from __future__ import annotations

from pathlib import Path

import pytest
import redis
from hypothesis import given
from hypothesis import strategies as st

from memq.core.errors import InvalidIdentifier
from memq.core.identity import (
    ANONYMOUS_USER_ID,
    MAX_USER_ID_LENGTH,
    ContextKey,
    decode_segment,
    encode_segment,
    encode_user,
    user_id_of,
    validate_agent_name,
    validate_user_id,
)
from memq.core.keys import KeySchema
from memq.core.settings import MemqSettings
from producer.producer import MemoryProducer
from storage.document import Fact, MemoryDocument
from storage.files import FileMemoryStorage

REAL_IDS = [
    "alice@example.com",
    "auth0|5f7c8ec7c33c6c004bbafe82",
    "google-oauth2|1234567890",
    "first.last",
    "user:42",
    "x{y}",
    "../etc",
    "a/b",
    "Ünïcødé",
    "用户",
    "a b",
    "%41",
    "CON",
]


@pytest.mark.parametrize("user", REAL_IDS)
def test_real_user_ids_are_accepted_and_round_trip_through_a_context_id(user: str) -> None:
    key = ContextKey.create("thread-1", user, "coder")
    assert key.user_id == user
    assert key.id.count(":") == 2 and "{" not in key.id and "}" not in key.id
    assert ContextKey.from_id(key.id) == key
    assert user_id_of(key.id) == user


@pytest.mark.parametrize("agent", ["Research.Bot", "team/alpha", "agent@v2", "ö"])
def test_real_agent_names_are_accepted(agent: str) -> None:
    key = ContextKey.create("t", "u", agent)
    assert key.agent_name == agent.lower()
    assert ContextKey.from_id(key.id) == key


@pytest.mark.parametrize(
    "bad",
    ["", " ", "\t\n", "a\x00b", "a\x1bb", "a\x7fb", "a\u0085b", "\ud800", "x\udfffy", 5],
)
def test_control_characters_blanks_and_lone_surrogates_are_typed_errors(bad: object) -> None:
    with pytest.raises(InvalidIdentifier):
        validate_user_id(bad)
    with pytest.raises(InvalidIdentifier):
        validate_agent_name(bad)
    with pytest.raises(InvalidIdentifier):
        ContextKey.create(bad, "u", None)


def test_a_lone_surrogate_thread_id_is_a_typed_error_not_a_unicode_error() -> None:
    with pytest.raises(InvalidIdentifier):
        ContextKey.create("thread-\ud83d", "alice@example.com", None)


def test_overlong_ids_are_refused_in_one_line() -> None:
    with pytest.raises(InvalidIdentifier, match=str(MAX_USER_ID_LENGTH)):
        validate_user_id("a" * (MAX_USER_ID_LENGTH + 1))
    assert validate_user_id("a" * MAX_USER_ID_LENGTH)


_printable = st.text(
    st.characters(blacklist_categories=("Cc", "Cs", "Zl", "Zp")), min_size=0, max_size=40
)


@given(a=_printable, b=_printable)
def test_encoding_is_injective_and_decodes_back(a: str, b: str) -> None:
    ea, eb = encode_segment(a), encode_segment(b)
    assert decode_segment(ea) == a
    assert (ea == eb) == (a == b)
    # Case-insensitive file systems see the same name only when the ids differ in letter case.
    if ea.lower() == eb.lower():
        assert a.lower() == b.lower()
    assert all(c.isascii() and (c.isalnum() or c in "%_-") for c in ea)


@given(st.from_regex(r"[A-Za-z0-9_-]{1,40}", fullmatch=True))
def test_encoding_is_the_identity_on_the_old_alphabet(old: str) -> None:
    """Documents stored before real ids were accepted keep their keys and paths."""
    assert encode_segment(old) == old
    if old != "default":
        assert encode_user(old) == old
        assert (
            KeySchema("memq", 8).memory_document(old, "coder").endswith(f"}}:mem:{old}:coder:doc")
        )


def test_anonymous_and_the_literal_default_are_two_users(tmp_path: Path) -> None:
    assert validate_user_id(None) == ANONYMOUS_USER_ID != "default"
    anon = ContextKey.create("t", None, None)
    literal = ContextKey.create("t", "default", None)
    assert anon.id != literal.id
    assert ContextKey.from_id(anon.id).user_id == ANONYMOUS_USER_ID
    assert ContextKey.from_id(literal.id).user_id == "default"
    keys = KeySchema("memq", 1)
    assert keys.memory_document(ANONYMOUS_USER_ID, None) != keys.memory_document("default", None)
    # The anonymous user keeps the place the shared memory had, so its data is still found.
    assert keys.memory_document(ANONYMOUS_USER_ID, None) == "memq:{memq:0}:mem:default::doc"
    assert anon.id == "t:default:"

    storage = FileMemoryStorage(MemqSettings(storage_dir=str(tmp_path)))
    assert storage.path(None) == tmp_path / "users" / "default" / "memory.json"
    storage.save(None, None, MemoryDocument(facts=[Fact(content="anonymous fact")]))
    assert storage.load("default").facts == []
    assert [f.content for f in storage.load(None).facts] == ["anonymous fact"]


def test_file_storage_stores_and_lists_real_ids(tmp_path: Path) -> None:
    storage = FileMemoryStorage(MemqSettings(storage_dir=str(tmp_path)))
    for i, user in enumerate(REAL_IDS):
        storage.save(user, "Research.Bot", MemoryDocument(facts=[Fact(content=f"fact {i}")]))
    for i, user in enumerate(REAL_IDS):
        assert [f.content for f in storage.load(user, "research.bot").facts] == [f"fact {i}"]
        path = storage.path(user, "research.bot")
        assert path.is_relative_to(tmp_path / "users")
        assert path.relative_to(tmp_path / "users").parts[0] == encode_user(user)
    assert sorted(storage.list_users()) == sorted(REAL_IDS)
    assert storage.list_agents("alice@example.com") == ["research.bot"]
    assert storage.delete("alice@example.com", "research.bot")
    assert "alice@example.com" not in storage.list_users()


@pytest.mark.integration
@pytest.mark.parametrize("user", ["alice@example.com", "auth0|abc", "first.last"])
def test_after_agent_stores_conversations_of_real_user_ids(
    settings: MemqSettings, redis_client: redis.Redis, user: str
) -> None:
    messages = [
        {"role": "user", "content": "I live in Lyon"},
        {"role": "assistant", "content": "Noted."},
    ]
    with MemoryProducer(settings) as producer:
        assert producer.after_agent("thread.1", user, "Research.Bot", messages) is True
        result = producer.enqueue("thread.2", user, None, messages)
    assert result is not None
    assert ContextKey.from_id(result.context_id).user_id == user
    keys = KeySchema(settings.key_prefix, settings.shards)
    assert redis_client.exists(keys.for_context(result.context_id).context(result.context_id))


@pytest.mark.integration
def test_a_lone_surrogate_thread_id_is_refused_by_enqueue_with_a_typed_error(
    settings: MemqSettings,
) -> None:
    with MemoryProducer(settings) as producer:
        with pytest.raises(InvalidIdentifier):
            producer.enqueue(
                "t\ud800", "alice@example.com", None, [{"role": "user", "content": "hi"}]
            )
        assert (
            producer.after_agent("t\ud800", "u", None, [{"role": "user", "content": "hi"}]) is False
        )
