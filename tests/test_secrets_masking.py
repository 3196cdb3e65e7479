"""Secrets never reach an operator's screen: settings errors, masked URLs, `memq config`."""

from __future__ import annotations

import pytest

from memq.cli import main
from memq.core.errors import ConfigError
from memq.core.redis_urls import mask_url
from memq.core.settings import load_settings


def test_a_settings_error_names_the_problem_but_not_the_values(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-supersecret")
    monkeypatch.setenv("MEMQ_REDIS_URL", "redis://:hunter2@127.0.0.1/0")
    with pytest.raises(ConfigError) as caught:
        load_settings(debounce_seconds=100, max_delay_seconds=10)
    message = str(caught.value)
    assert "max_delay_seconds" in message
    assert "sk-supersecret" not in message and "hunter2" not in message


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("redis://:hunter2@127.0.0.1:6380/0", "redis://:***@127.0.0.1:6380/0"),
        ("redis://bob:hunter2@127.0.0.1/0", "redis://bob:***@127.0.0.1/0"),
        ("redis://127.0.0.1/0?password=hunter2&db=1", "redis://127.0.0.1/0?password=***&db=1"),
        ("https://bob:sk-xyz@127.0.0.1/v1", "https://bob:***@127.0.0.1/v1"),
        ("redis://127.0.0.1:6379/0", "redis://127.0.0.1:6379/0"),
    ],
)
def test_urls_are_shown_without_their_passwords(url: str, shown: str) -> None:
    assert mask_url(url) == shown


def test_memq_config_masks_every_secret(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    monkeypatch.setenv("MEMQ_REDIS_URL", "redis://127.0.0.1/0?password=hunter2")
    monkeypatch.setenv("MEMQ_LLM_BASE_URL", "https://bob:sk-xyz@127.0.0.1/v1")
    monkeypatch.setenv("MEMQ_LLM_API_KEY", "sk-supersecret")
    assert main(["config"]) == 0
    out = capsys.readouterr().out
    assert "MEMQ_LLM_BASE_URL" in out
    assert not any(secret in out for secret in ("hunter2", "sk-xyz", "sk-supersecret"))
