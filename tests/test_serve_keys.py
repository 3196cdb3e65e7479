"""API-key configuration: digests only in memory, one clear line per mistake, never the key."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from memq.core.errors import ConfigError
from memq.core.settings import MemqSettings
from memq.operations.access import Forbidden, Unauthorized
from memq.server.auth import (
    Keyring,
    bearer_token,
    digest,
    key_file_entry,
    new_key,
)

SECRET = "memq_plain_secret_key_value_123456"


def test_keys_are_kept_as_digests_and_resolve_to_their_principal(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text(
        '{"keys": [' + key_file_entry("app1", SECRET, ["agent"], "app1-") + "]}", encoding="utf-8"
    )
    keyring = Keyring.from_settings(MemqSettings(serve_api_keys_file=path))
    assert SECRET not in repr(keyring) and list(keyring.by_digest) == [digest(SECRET)]
    principal = keyring.resolve(SECRET)
    assert (principal.name, principal.scopes, principal.user_prefix) == (
        "app1",
        frozenset({"agent"}),
        "app1-",
    )
    principal.require_user("app1-alice")
    with pytest.raises(Forbidden, match="bound to user ids starting with 'app1-'"):
        principal.require_user("app2-bob")
    with pytest.raises(Forbidden, match="'admin' scope"):
        principal.require_scope("admin")
    with pytest.raises(Unauthorized, match="unknown API key"):
        keyring.resolve(SECRET + "x")
    with pytest.raises(Unauthorized, match="Bearer"):
        keyring.resolve(None)


def test_admin_implies_agent_and_environment_keys_add_to_the_file() -> None:
    env = json.dumps([{"name": "ops", "key": SECRET, "scopes": ["admin"]}])
    keyring = Keyring.from_settings(MemqSettings(serve_api_keys=env))
    assert keyring.resolve(SECRET).scopes == frozenset({"agent", "admin"})


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([{"name": "a", "key": "short", "scopes": ["agent"]}], "at least 16 characters"),
        ([{"name": "a", "sha256": "00", "scopes": ["agent"]}], "64 lower-case hex"),
        ([{"name": "a", "key": SECRET, "scopes": ["root"]}], "non-empty list of agent, admin"),
        (
            [{"name": "a", "key": SECRET, "sha256": digest(SECRET), "scopes": ["agent"]}],
            "exactly one",
        ),
        ([{"key": SECRET, "scopes": ["agent"]}], "needs a non-blank `name`"),
        ([{"name": "a", "key": SECRET, "scopes": ["agent"]}] * 2, "defined twice"),
        (["just a string"], "must be an object"),
        ([{"name": "a", "key": SECRET, "scopes": ["agent"], "user_prefix": ""}], "user_prefix"),
    ],
)
def test_a_bad_key_entry_is_one_line_that_never_repeats_the_key(
    entries: list[Any], message: str
) -> None:
    with pytest.raises(ConfigError, match=message) as caught:
        Keyring.from_entries(entries)
    assert SECRET not in str(caught.value)


def test_a_key_file_that_is_not_json_names_the_file_not_its_text(tmp_path: Path) -> None:
    path = tmp_path / "keys.json"
    path.write_text('{"keys": [{"key": "' + SECRET + '", ', encoding="utf-8")
    with pytest.raises(ConfigError, match="not JSON") as caught:
        Keyring.from_settings(MemqSettings(serve_api_keys_file=path))
    assert SECRET not in str(caught.value)
    with pytest.raises(ConfigError, match="cannot read it"):
        Keyring.from_settings(MemqSettings(serve_api_keys_file=tmp_path / "missing.json"))


def test_new_keys_are_long_random_and_recognisable() -> None:
    first, second = new_key(), new_key()
    assert first != second and first.startswith("memq_") and len(first) >= 40


@pytest.mark.parametrize(
    ("header", "token"),
    [
        ("Bearer abc", "abc"),
        ("bearer  abc ", "abc"),
        ("Basic abc", None),
        ("Bearer", None),
        (None, None),
    ],
)
def test_only_a_bearer_header_carries_a_key(header: str | None, token: str | None) -> None:
    assert bearer_token(header) == token
