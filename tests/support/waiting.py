"""Re-export: waiting on a condition lives in :mod:`memq.testing.waiting`."""

from __future__ import annotations

from memq.testing.waiting import wait_for

__all__ = ["wait_for"]
