"""Stand-in for ``deerflow.config.runtime_paths``: DeerFlow's state folder, which its memory
factory injects as ``storage_path`` when the config names none."""

from __future__ import annotations

import os
from pathlib import Path


def runtime_home() -> Path:
    """``DEER_FLOW_HOME`` when set, else ``.deer-flow`` under the working folder (absolute)."""
    return Path(os.environ.get("DEER_FLOW_HOME") or ".deer-flow").resolve()
