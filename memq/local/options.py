"""What a local stack runs: which children, their log level and folder, the restart policy."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from memq.local.supervision import RestartPolicy


@dataclass
class StackOptions:
    worker: bool = True
    beat: bool = True
    flower: bool = True
    exporter: bool = False  # `memq up` turns it on (it binds a fixed port)
    serve: bool = False  # `memq serve`, the HTTP API and MCP; `memq up` turns it on
    loglevel: str = "INFO"
    # None: a private redis-server only when no Redis is configured; True: always (the demo never
    # touches a configured Redis).
    private_redis: bool | None = None
    # None: children write into the terminal (memq up); a folder: one log file per child (demo).
    log_dir: Path | None = None
    extra_env: Mapping[str, str] = field(default_factory=dict)
    restart: RestartPolicy = field(default_factory=RestartPolicy)
