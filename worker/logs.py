"""Quiet worker and beat logs: what an operator reads in `memq up`'s terminal.

Celery logs three INFO lines per tick (beat's "Sending due task", the worker's "received" and
"succeeded") and two more per extraction, next to memq's own one-line extraction record. At INFO
these are dropped, so an idle stack prints nothing and each extraction is the one line memq
writes; at DEBUG they are all kept. Failures (WARNING and above) always pass. Beat's "Couldn't
apply scheduled task" during a Redis outage keeps its line but loses the traceback, which would
otherwise fill a screen every tick.
"""

from __future__ import annotations

import logging

# The loggers whose per-task INFO lines repeat memq's own records, and how those lines begin
# (the format strings, not the rendered text: "beat: Starting..." on the same logger stays).
_CHATTY = ("celery.beat", "celery.app.trace", "celery.worker.strategy")
_PER_TASK = ("Task ", "Scheduler: Sending due task")
_BEAT = "celery.beat"


class TaskChatterFilter(logging.Filter):
    """Drops Celery's per-task INFO lines unless the logger is at DEBUG."""

    def filter(self, record: logging.LogRecord) -> bool:
        if record.levelno != logging.INFO or not str(record.msg).startswith(_PER_TASK):
            return True
        return logging.getLogger(record.name).isEnabledFor(logging.DEBUG)


class OutageTracebackFilter(logging.Filter):
    """Keeps beat's error line about a broker it cannot reach, without the traceback."""

    def filter(self, record: logging.LogRecord) -> bool:
        exc = record.exc_info[1] if record.exc_info else None
        if exc is not None and _is_connection_error(exc):
            record.exc_info = None
            record.exc_text = None
        return True


def _is_connection_error(exc: BaseException) -> bool:
    seen: BaseException | None = exc
    while seen is not None:
        if isinstance(seen, ConnectionError | TimeoutError) or type(seen).__name__ in (
            "ConnectionError",
            "TimeoutError",
            "OperationalError",
        ):
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def install_quiet_logging() -> None:
    """Attach the filters once per process (idempotent); the entry point calls it."""
    for name in _CHATTY:
        logger = logging.getLogger(name)
        if not any(isinstance(f, TaskChatterFilter) for f in logger.filters):
            logger.addFilter(TaskChatterFilter())
    beat = logging.getLogger(_BEAT)
    if not any(isinstance(f, OutageTracebackFilter) for f in beat.filters):
        beat.addFilter(OutageTracebackFilter())
