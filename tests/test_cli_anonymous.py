"""`--anonymous`: how an operator names the anonymous user (an agent that passes no user id,
DeerFlow's ``default``) in every CLI command that takes a user. ``default`` on the command line is
the user literally named so, a different one. Real redis-server, in-process ``main(argv)``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from memq.cli import build_parser
from memq.core.identity import ANONYMOUS_USER_ID
from memq.core.settings import MemqSettings
from storage import get_storage
from storage.document import Fact, MemoryDocument
from tests.support.cli import Run, assert_one_line_error, write_json

pytestmark = pytest.mark.integration

CONVERSATION = [
    {"role": "user", "content": "I am anonymous and I like tea."},
    {"role": "assistant", "content": "Tea it is."},
]


def _seed(settings: MemqSettings) -> None:
    store = get_storage(settings)
    store.save(ANONYMOUS_USER_ID, None, MemoryDocument(facts=[Fact(id="f_a", content="anon-fact")]))
    store.save("default", None, MemoryDocument(facts=[Fact(id="f_d", content="literal-fact")]))


def test_every_user_command_reaches_the_anonymous_user_with_anonymous(
    run: Run, cli_env: MemqSettings, tmp_path: Path
) -> None:
    _seed(cli_env)
    code, out, _ = run("show", "--anonymous")
    assert code == 0 and "anon-fact" in out and "literal-fact" not in out
    assert out.startswith("user (anonymous) ·")
    code, out, _ = run("show", "default")
    assert code == 0 and "literal-fact" in out and "anon-fact" not in out
    code, out, _ = run("show", "--anonymous", "--json")
    assert json.loads(out)["user_id"] is None  # as agents name it: no user id

    code, out, _ = run("inject", "--anonymous")
    assert code == 0 and "anon-fact" in out
    code, out, _ = run("facts", "add", "--anonymous", "Likes green tea")
    assert code == 0 and out.strip().endswith("to user (anonymous), agent (global)")
    code, out, _ = run("facts", "search", "--anonymous", "tea")
    assert code == 0 and "Likes green tea" in out
    code, out, _ = run("why", "--anonymous", "f_a")
    assert code == 0 and "anon-fact" in out
    code, out, _ = run("facts", "edit", "--anonymous", "f_a", "--content", "anon-edited")
    assert code == 0 and "anon-edited" in out
    code, out, _ = run("facts", "delete", "--anonymous", "f_a")
    assert code == 0 and "deleted f_a" in out

    exported = tmp_path / "export.json"
    assert run("export", "--anonymous", "-o", str(exported))[0] == 0
    assert [f["content"] for f in json.loads(exported.read_text("utf-8"))["facts"]] == [
        "Likes green tea"
    ]
    code, out, _ = run("import", "--anonymous", str(exported), "--agent", "coder")
    assert (code, out.strip()) == (0, "imported 1 fact into user (anonymous), agent coder")

    messages = write_json(tmp_path / "messages.json", CONVERSATION)
    code, out, _ = run("enqueue", messages, "--thread", "t-1", "--anonymous")
    assert code == 0 and out.startswith("enqueued t-1:default: ")

    code, out, _ = run("forget", "--anonymous")
    assert code == 0 and out.startswith("forgot user (anonymous): 2 memory documents")
    assert get_storage(cli_env).list_agents(ANONYMOUS_USER_ID) == []
    assert [f.content for f in get_storage(cli_env).load("default").facts] == ["literal-fact"]


@pytest.mark.parametrize(
    "argv",
    [
        ("show", "--anonymous", "alice@example.com"),
        ("forget", "alice@example.com", "--anonymous"),
        ("enqueue", "m.json", "--thread", "t", "--user", "bob", "--anonymous"),
        ("show",),
        ("inject", "--agent", "coder"),
        ("import", "--anonymous", "a.json", "b.json"),
    ],
)
def test_a_user_and_anonymous_together_or_neither_is_one_line(
    run: Run, cli_env: MemqSettings, argv: tuple[str, ...]
) -> None:
    code, out, err = run(*argv)
    assert_one_line_error(code, err, "--anonymous")
    assert out == ""


def _user_commands(
    parser: argparse.ArgumentParser, path: str = "memq"
) -> list[tuple[str, set[str]]]:
    """(command path, option strings) of every (sub-)command that takes a user."""
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += _user_commands(child, f"{path} {name}")
        elif action.dest == "user":
            found.append((path, {s for a in parser._actions for s in a.option_strings}))
    return found


def test_every_command_that_takes_a_user_takes_anonymous() -> None:
    commands = _user_commands(build_parser())
    names = {path for path, _ in commands}
    assert {
        "memq show",
        "memq forget",
        "memq import",
        "memq enqueue",
        "memq facts add",
        "memq why",
        "memq mcp",
    } <= names
    assert [path for path, options in commands if "--anonymous" not in options] == []
