"""Pages of a list answer: every list a door returns is cut to ``limit`` items (a bounded default)
and says where the next page starts, so no answer grows with the data.

The cursor is the offset of the next page, as text: opaque to callers, checked when it comes
back. Pure functions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

from memq.core.errors import InvalidIdentifier

T = TypeVar("T")

DEFAULT_LIMIT = 100
MAX_LIMIT = 1000


@dataclass(frozen=True, slots=True)
class Page(Generic[T]):
    items: list[T]
    next_cursor: str | None


def offset_of(cursor: str | None) -> int:
    """Where a page starts: 0 without a cursor; a cursor this server did not give is refused."""
    if cursor is None or cursor == "":
        return 0
    if not cursor.isdigit() or len(cursor) > 9:
        raise InvalidIdentifier("cursor: not one this server gave (use next_cursor as it came)")
    return int(cursor)


def page(items: Sequence[T], limit: int, cursor: str | None) -> Page[T]:
    """``limit`` items of ``items`` from ``cursor`` on, and the cursor of the next page (None on
    the last). ``items`` may hold one item past the page: that is how a caller that loads only
    ``offset + limit + 1`` items knows there is more."""
    start = offset_of(cursor)
    chunk = list(items[start : start + limit])
    more = len(items) > start + limit
    return Page(chunk, str(start + limit) if more else None)


def needed(limit: int, cursor: str | None) -> int:
    """How many items from the start a page needs loaded (one more, to know if there is more)."""
    return offset_of(cursor) + limit + 1
