"""How many items one call may carry: the lists a caller sends (the messages of a hand-off, the
dead letters to retry or purge) are refused whole when longer than their cap, never cut short,
so a door answers success only for everything it was given."""

from __future__ import annotations

from collections.abc import Sized

from memq.core.errors import PayloadTooLarge

# Dead letters one retry or purge may name (``"all"`` is the way to reach every one).
MAX_DEAD_IDS = 1000


def check_count(items: Sized, cap: int, what: str) -> None:
    """A list longer than ``cap``: PayloadTooLarge (413 over HTTP, one line elsewhere)."""
    if len(items) > cap:
        raise PayloadTooLarge(f"{len(items)} {what}; at most {cap} per request")
