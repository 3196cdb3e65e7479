"""Reading a JSON file a person named (an import, a conversation, a data set): a missing file,
an unreadable one or bad JSON becomes one clear line in the caller's own error type."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from memq.core.errors import MemqError


def read_json_file(path: str | Path, error: type[MemqError]) -> Any:
    """The parsed JSON of ``path``; what goes wrong is raised as ``error`` naming the file."""
    try:
        text = Path(path).read_text(encoding="utf-8")
    except FileNotFoundError:
        raise error(f"no such file: {path}") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise error(f"cannot read {path}: {exc}") from exc
    try:
        return json.loads(text)
    except json.JSONDecodeError as exc:
        raise error(
            f"{path} is not valid JSON (line {exc.lineno}, column {exc.colno}: {exc.msg})"
        ) from exc
    except RecursionError:
        raise error(f"{path} is nested too deeply to read") from None
