"""The `memq` CLI in-process, for the CLI tests: the ``run`` fixture (``main(argv)`` with its
exit code and captured output), ``cli_env`` (the test's settings in the environment, as in an
operator's shell) and the checks every command's errors share."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from memq.cli import main
from memq.core.settings import MemqSettings

Run = Callable[..., tuple[int, str, str]]


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, settings: MemqSettings) -> MemqSettings:
    """The CLI reads its settings from the environment, like an operator's shell."""
    for name in ("redis_url", "key_prefix", "storage_dir", "data_dir", "llm_provider"):
        value = getattr(settings, name)
        monkeypatch.setenv(f"MEMQ_{name.upper()}", str(value))
    return settings


@pytest.fixture
def run(capsys: pytest.CaptureFixture[str]) -> Run:
    def invoke(*argv: str) -> tuple[int, str, str]:
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err

    return invoke


def write_json(path: Path, data: Any) -> str:
    path.write_text(json.dumps(data), encoding="utf-8")
    return str(path)


def assert_one_line_error(code: int, err: str, *needles: str) -> None:
    assert code != 0
    assert len(err.strip().splitlines()) == 1, err
    assert "Traceback" not in err
    for needle in needles:
        assert needle in err
