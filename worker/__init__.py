"""The worker side: the Celery app, the ticker and the extraction.

``worker.app`` is the entry point of ``celery -A worker.app worker|beat``. It is built on first
access from :func:`memq.core.settings.load_settings`, never at import time, so importing ``worker``
reads no environment and opens no connection.
"""

from __future__ import annotations

import threading
from typing import Any

_build_lock = threading.Lock()


def __getattr__(name: str) -> Any:
    if name != "app":
        raise AttributeError(f"module 'worker' has no attribute {name!r}")
    with _build_lock:
        built = globals().get("app")
        if built is None:
            from memq.core.settings import load_settings
            from worker.celery_app import create_app
            from worker.logs import install_quiet_logging

            built = create_app(load_settings())
            install_quiet_logging()  # `celery -A worker.app` processes: no per-tick log lines
            globals()["app"] = built  # later lookups find it without coming back here
    return built
