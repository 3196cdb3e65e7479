"""Where settings come from besides the environment: the ``memory:`` section of a YAML file
(DeerFlow's field names accepted) and comma-separated lists. Pure functions, no settings model."""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from memq.core.errors import ConfigError

# DeerFlow's `memory:` field names that differ from ours; values converted where the type differs.
_DEERFLOW_RENAMES: dict[str, str] = {
    "max_injection_tokens": "injected_memory_max_tokens",
    "model_name": "llm_model",
    "storage_path": "storage_dir",
}


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
