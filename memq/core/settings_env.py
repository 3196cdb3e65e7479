"""Settings handed to a child process: every field as a ``MEMQ_*`` variable."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from pydantic import SecretStr

from memq.core.settings import MemqSettings


def settings_env(settings: MemqSettings) -> dict[str, str]:
    """Every setting as a ``MEMQ_*`` variable, so a child process builds exactly these settings
    (including values given as keyword arguments, which no environment of the parent holds)."""
    env: dict[str, str] = {}
    for name in type(settings).model_fields:
        value: Any = getattr(settings, name)
        if value is None:
            continue
        if isinstance(value, SecretStr):
            value = value.get_secret_value()
        elif isinstance(value, tuple):
            value = ",".join(value)
        elif isinstance(value, Path):
            value = str(value.resolve())
        elif isinstance(value, bool):
            value = "true" if value else "false"
        env[f"MEMQ_{name.upper()}"] = str(value)
    return env
