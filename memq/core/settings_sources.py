"""Where settings come from besides the environment: the ``memory:`` section of a YAML file
(DeerFlow's field names accepted) and comma-separated lists. Pure functions, no settings model."""

from __future__ import annotations

import difflib
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any
from urllib.parse import quote

import yaml

from memq.core.errors import ConfigError

# DeerFlow's `memory:` field names that differ from ours; values converted where the type differs.
_DEERFLOW_RENAMES: dict[str, str] = {
    "max_injection_tokens": "injected_memory_max_tokens",
    "model_name": "llm_model",
    "storage_path": "storage_dir",
}


# DeerFlow `memory:` keys that mean nothing to memq (its own storage plug point and tool mode):
# read without a word, so a DeerFlow config file is never reported as misspelt.
DEERFLOW_ONLY_KEYS = frozenset({"storage_class", "mode"})
# MEMQ_* variables that are not settings but are read by memq.
NON_SETTING_VARIABLES = frozenset({"MEMQ_CONFIG"})


def unknown_settings(
    fields: Iterable[str], environ: Mapping[str, str], yaml_path: str | None
) -> list[str]:
    """One line per ``MEMQ_*`` variable and per YAML ``memory:`` key that is no setting of
    memq, naming the closest known one: a typo (``MEMQ_REDIS_ULR``) must not fall back to a
    default without a word. Never a value (it may be a secret)."""
    names = sorted(fields)
    variables = {f"MEMQ_{name.upper()}" for name in names} | NON_SETTING_VARIABLES
    lines = []
    for variable in sorted(v for v in environ if v.startswith("MEMQ_") and v not in variables):
        close = difflib.get_close_matches(variable.upper(), sorted(variables), n=1, cutoff=0.6)
        hint = f"; did you mean {close[0]}?" if close else ""
        lines.append(f"memq: unknown setting {variable} (ignored){hint}")
    if yaml_path:
        for key in sorted(_yaml_keys(yaml_path)):
            if key in names or key in DEERFLOW_ONLY_KEYS:
                continue
            close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
            hint = f"; did you mean {close[0]}?" if close else ""
            lines.append(f"memq: unknown key `memory.{key}` in {yaml_path} (ignored){hint}")
    return lines


def _yaml_keys(path: str) -> list[str]:
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return []  # reading the settings reports that one
    section = raw.get("memory", {}) if isinstance(raw, Mapping) else {}
    if not isinstance(section, Mapping):
        return []
    return list(settings_values({k: True for k in section}))


def split_csv(value: Any) -> Any:
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    return value


def yaml_memory_section(path: str | None) -> dict[str, Any]:
    if not path:
        return {}
    try:
        raw = yaml.safe_load(Path(path).read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError(f"MEMQ_CONFIG={path}: cannot read it as YAML: {exc}") from exc
    if not isinstance(raw, Mapping):
        raise ConfigError(f"MEMQ_CONFIG={path}: the top level must be a mapping")
    section = raw.get("memory", {}) or {}
    if not isinstance(section, Mapping):
        raise ConfigError(f"MEMQ_CONFIG={path}: `memory:` must be a mapping")
    return settings_values(section)


def settings_values(section: Mapping[Any, Any]) -> dict[str, Any]:
    """A DeerFlow ``memory:`` section (or a DeerFlow ``backend_config``) as memq setting names:
    DeerFlow's names renamed, explicit nulls dropped (they mean "use the default", DeerFlow
    #4217), everything else passed as is."""
    values: dict[str, Any] = {}
    for key, value in section.items():
        if value is None:
            continue
        values[_DEERFLOW_RENAMES.get(str(key), str(key))] = value
    return values


def private_redis_url(data_dir: Path) -> str | None:
    """The agents' URL of the private Redis `memq up` runs for ``data_dir`` (its password and
    port are 0600 files there), or None when that folder has none (or they cannot be read).
    A process of the same folder (the CLI, `memq mcp`, an agent) then finds the stack memq
    started without being told; a URL configured anywhere wins."""
    redis_dir = data_dir / "redis"
    try:
        password = (redis_dir / "password").read_text(encoding="utf-8").strip()
        port = int((redis_dir / "port").read_text(encoding="utf-8").strip())
    except (OSError, ValueError):
        return None
    if not password or not 0 < port < 65536:
        return None
    return f"redis://:{quote(password, safe='')}@127.0.0.1:{port}/0"
