"""Misspelt settings are never ignored in silence: every process names an unknown MEMQ_*
variable or YAML key (with the closest known setting) when it loads its settings, and `memq
config --check` and `memq doctor` fail on them. Real `memq` processes."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from memq.core.settings import MemqSettings
from memq.core.settings_sources import unknown_settings
from memq.testing.celery_procs import REPO_ROOT

FIELDS = MemqSettings.model_fields


def test_an_unknown_variable_names_the_closest_setting_and_never_its_value() -> None:
    lines = unknown_settings(FIELDS, {"MEMQ_REDIS_ULR": "redis://:s3cret@h/0"}, None)
    assert lines == ["memq: unknown setting MEMQ_REDIS_ULR (ignored); did you mean MEMQ_REDIS_URL?"]
    assert unknown_settings(FIELDS, {"MEMQ_REDIS_URL": "x", "MEMQ_CONFIG": "y"}, None) == []
    assert unknown_settings(FIELDS, {"MEMQ_ZZZZZZZZ": "x"}, None) == [
        "memq: unknown setting MEMQ_ZZZZZZZZ (ignored)"
    ]


def test_an_unknown_yaml_key_is_named_and_deerflow_names_are_known(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text(
        "memory:\n  debounce_secnds: 5\n  max_injection_tokens: 900\n  storage_class: x.Y\n"
        "  mode: middleware\n  max_facts: 50\n",
        encoding="utf-8",
    )
    assert unknown_settings(FIELDS, {}, str(config)) == [
        f"memq: unknown key `memory.debounce_secnds` in {config} (ignored); "
        "did you mean debounce_seconds?"
    ]


def _memq(*args: str, **env: str) -> subprocess.CompletedProcess[str]:
    base = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    base["PYTHONPATH"] = str(REPO_ROOT)
    return subprocess.run(
        [sys.executable, "-m", "memq.cli", *args],
        env={**base, **env},
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def test_config_check_fails_on_a_typo_and_every_process_reports_it(tmp_path: Path) -> None:
    env = {"MEMQ_REDIS_ULR": "redis://127.0.0.1:9/0", "MEMQ_DATA_DIR": str(tmp_path)}
    checked = _memq("config", "--check", **env)
    assert checked.returncode == 1
    assert "unknown setting MEMQ_REDIS_ULR (ignored); did you mean MEMQ_REDIS_URL?" in (
        checked.stderr
    )
    # Any command that loads the settings says it, one line.
    shown = _memq("config", **env)
    assert shown.returncode == 0
    assert shown.stderr.count("MEMQ_REDIS_ULR") == 1
    assert "redis://127.0.0.1:9" not in shown.stderr  # never the value
    clean = _memq("config", "--check", MEMQ_DATA_DIR=str(tmp_path))
    assert clean.returncode == 0, clean.stderr
    assert "every setting is known and valid" in clean.stdout


def test_config_check_fails_on_a_yaml_typo(tmp_path: Path) -> None:
    config = tmp_path / "config.yaml"
    config.write_text("memory:\n  max_fatcs: 50\n", encoding="utf-8")
    checked = _memq("config", "--check", MEMQ_CONFIG=str(config), MEMQ_DATA_DIR=str(tmp_path))
    assert checked.returncode == 1
    assert "unknown key `memory.max_fatcs`" in checked.stderr
    assert "did you mean max_facts?" in checked.stderr
