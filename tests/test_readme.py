"""The README is the newcomer's entry point: its commands and its settings table must be true."""

from __future__ import annotations

import re
from pathlib import Path

from memq.cli import build_parser
from memq.commands.config import README_BEGIN, README_END, settings_markdown
from memq.core.settings import MemqSettings

ROOT = Path(__file__).resolve().parent.parent


def readme() -> str:
    return (ROOT / "README.md").read_text(encoding="utf-8")


def test_readme_opens_with_the_two_commands() -> None:
    first_block = re.search(r"```[a-z]*\n(.*?)```", readme(), re.DOTALL)
    assert first_block is not None
    commands = [line.split("#")[0].strip() for line in first_block.group(1).splitlines()]
    assert commands[:2] == ["make demo", "make test"]
    makefile = (ROOT / "Makefile").read_text(encoding="utf-8")
    assert re.search(r"^demo:.*\n\t.*memq demo$", makefile, re.MULTILINE)
    assert re.search(r"^test:", makefile, re.MULTILINE)


def test_every_setting_is_in_the_readme_with_its_default() -> None:
    text = readme()
    for name in MemqSettings.model_fields:
        assert f"`MEMQ_{name.upper()}`" in text, f"MEMQ_{name.upper()} is not documented"
    start, end = text.index(README_BEGIN), text.index(README_END) + len(README_END)
    # Regenerate with `memq config --markdown` when the settings change.
    assert text[start:end] == settings_markdown()


def test_every_cli_command_is_in_the_readme() -> None:
    parser = build_parser()
    (sub,) = [a for a in parser._actions if a.dest == "command"]
    text = readme()
    for command in sub.choices:  # type: ignore[union-attr]
        assert f"`memq {command}" in text, f"memq {command} is not in the README"


def test_readme_shows_the_agent_imports_and_links_the_docs() -> None:
    text = readme()
    assert "from memq import MemoryProducer, MemoryInjector" in text
    for page in ("docs/operations.md", "docs/architecture.md"):
        assert f"]({page})" in text
        assert (ROOT / page).is_file()
