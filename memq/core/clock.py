"""The one wall clock of memq, in epoch milliseconds: deadlines, leases, windows and stamps are
all read from it (a test passes its own ``clock_ms`` where a part takes one)."""

from __future__ import annotations

import time


def now_ms() -> int:
    return time.time_ns() // 1_000_000
