"""memq's Lua scripts (the producer's, storage's and the worker's) are assembled by one loader from
shared fragments (memq/core/includes/*.lua): every include resolves, every fragment is used, no
script spells a fragment's steps out by hand, and what Redis receives compiles."""

from __future__ import annotations

import re
import sys
from importlib import resources
from pathlib import Path

import pytest
import redis

from memq.core.scripts import (
    INCLUDE_LINE,
    SHARED_FRAGMENTS,
    ScriptAssemblyError,
    assemble,
    assemble_with_includes,
)

PACKAGES = ("producer", "storage", "worker")
SCRIPTS = sorted(
    (package, entry.name.removesuffix(".lua"))
    for package in PACKAGES
    for entry in resources.files(package).iterdir()
    if entry.name.endswith(".lua")
)
FRAGMENTS = sorted(
    f"includes/{entry.name}"
    for entry in resources.files(SHARED_FRAGMENTS).joinpath("includes").iterdir()
    if entry.name.endswith(".lua")
)
FUNCTION = re.compile(r"^local function (\w+)\(", re.MULTILINE)


def defined_function(fragment: str) -> str:
    text = resources.files(SHARED_FRAGMENTS).joinpath(fragment).read_text(encoding="utf-8")
    (name,) = FUNCTION.findall(text)
    return name


def test_every_package_has_its_scripts_and_the_fragments_are_shared() -> None:
    assert {("worker", n) for n in ("complete", "fail", "release", "reap_expired")} <= set(SCRIPTS)
    assert {("producer", "enqueue"), ("storage", "erase_contexts")} <= set(SCRIPTS)
    assert "includes/release_claim.lua" in FRAGMENTS


@pytest.mark.parametrize(("package", "name"), SCRIPTS)
def test_assembled_script_has_no_unresolved_include_and_each_fragment_once(
    package: str, name: str
) -> None:
    source, pulled = assemble_with_includes(package, name)
    assert not INCLUDE_LINE.search(source)
    assert "@include" not in source
    for fragment in pulled:
        function = defined_function(fragment)
        assert source.count(f"local function {function}(") == 1
        # Pulled in for a reason: the script calls it (beyond its own definition).
        assert len(re.findall(rf"\b{function}\(", source)) >= 2, f"{name} never calls {function}"


def test_every_fragment_is_used_by_some_script() -> None:
    used = {f for package, name in SCRIPTS for f in assemble_with_includes(package, name)[1]}
    assert used == set(FRAGMENTS)


@pytest.mark.parametrize(("package", "name"), SCRIPTS)
def test_the_release_steps_live_only_in_their_fragment(package: str, name: str) -> None:
    """The claim-release sequence is written once: no script, in any package, spells it out by
    hand (erasing a user's contexts releases their claims through the same fragment)."""
    raw = resources.files(package).joinpath(f"{name}.lua").read_text(encoding="utf-8")
    assert not re.search(r"HDEL', ctx, 'claim_token'", raw)
    assert not re.search(r"'ZREM', (inflight|users\w*), id\)", raw)


@pytest.fixture
def lua_package(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    package = tmp_path / "luapkg_for_includes"
    (package / "includes").mkdir(parents=True)
    (package / "__init__.py").write_text("", encoding="utf-8")
    monkeypatch.syspath_prepend(str(tmp_path))
    # Each test writes its own package under the same name: never reuse an earlier test's import.
    monkeypatch.delitem(sys.modules, package.name, raising=False)
    return package


def test_nested_includes_come_first_and_each_is_inlined_once(lua_package: Path) -> None:
    (lua_package / "includes" / "base.lua").write_text("-- base\n", encoding="utf-8")
    (lua_package / "includes" / "top.lua").write_text(
        '--- @include "includes/base"\n-- top\n', encoding="utf-8"
    )
    (lua_package / "script.lua").write_text(
        "-- header\n--- @include 'includes/top.lua'\n-- @include \"includes/base\";\nreturn 1\n",
        encoding="utf-8",
    )
    source, pulled = assemble_with_includes("luapkg_for_includes", "script")
    assert pulled == ("includes/top.lua", "includes/base.lua")
    assert source == "-- header\n-- base\n-- top\n\nreturn 1\n"


def test_a_missing_fragment_is_named(lua_package: Path) -> None:
    (lua_package / "script.lua").write_text('--- @include "includes/nope"\n', encoding="utf-8")
    with pytest.raises(ScriptAssemblyError, match=r"script.lua: .*'includes/nope.lua' does not"):
        assemble("luapkg_for_includes", "script")


def test_an_include_cycle_is_refused(lua_package: Path) -> None:
    (lua_package / "includes" / "a.lua").write_text('--- @include "includes/b"\n', "utf-8")
    (lua_package / "includes" / "b.lua").write_text('--- @include "includes/a"\n', "utf-8")
    (lua_package / "script.lua").write_text('--- @include "includes/a"\n', encoding="utf-8")
    with pytest.raises(
        ScriptAssemblyError,
        match=re.escape("cycle: script.lua -> includes/a.lua -> includes/b.lua -> includes/a.lua"),
    ):
        assemble("luapkg_for_includes", "script")


@pytest.mark.integration
@pytest.mark.parametrize(("package", "name"), SCRIPTS)
def test_assembled_script_compiles_in_redis(
    package: str, name: str, redis_client: redis.Redis
) -> None:
    source = assemble(package, name)
    assert redis_client.script_load(source)
