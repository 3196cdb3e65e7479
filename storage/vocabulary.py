"""The rules every path applies to a fact's fields: when two facts are the same fact, what a
category name means, how a confidence is read.

One definition each, beside the document model, so an extraction, a hand edit, an import and the
DeerFlow backend cannot disagree (they did: one ignored whitespace when detecting duplicates and
another did not; ``category="Correction"`` was an unknown category on one path and a correction on
another).
"""

from __future__ import annotations

import difflib
import math
import re
from collections.abc import Iterable
from datetime import UTC, date, datetime
from typing import Any

from memq.core.errors import InvalidMemoryData

DEFAULT_CATEGORY = "context"
# What the user said the agent got wrong: kept before any other category (cap, injection budget).
CORRECTION = "correction"
CATEGORIES = ("preference", "knowledge", "context", "behavior", "goal", CORRECTION)


def content_key(content: str) -> str:
    """Two facts are the same fact when their contents differ only in case or whitespace."""
    return " ".join(content.split()).casefold()


def known_category(value: Any) -> str | None:
    """One of the six category names, or None: ``Preferences`` and `` preference `` are
    ``preference``; blank, non-text and unknown names are None."""
    if not isinstance(value, str) or not value.strip():
        return None
    name = value.strip().casefold()
    if name in CATEGORIES:
        return name
    if name.endswith("s") and name[:-1] in CATEGORIES:
        return name[:-1]
    return None


class UnknownCategory(InvalidMemoryData):
    """A hand-written fact's category is none of the categories extraction uses: 422."""


def check_category(category: str) -> str:
    """A category a person typed (HTTP, MCP, the inspector, the CLI), in its one spelling: a
    typo would make a category no prompt, guaranteed budget or protection rule knows."""
    known = known_category(category)
    if known is not None:
        return known
    close = difflib.get_close_matches(str(category).strip().casefold(), CATEGORIES, n=1)
    hint = f"; did you mean {close[0]!r}?" if close else ""
    raise UnknownCategory(f"unknown category {category!r} (known: {', '.join(CATEGORIES)}){hint}")


def normalise_category(value: Any) -> str:
    """A stored fact's category: a known name in its one spelling, other text kept as it is
    (DeerFlow files hold free categories), blank or non-text → the default category."""
    known = known_category(value)
    if known is not None:
        return known
    if isinstance(value, str) and value.strip():
        return value.strip()
    return DEFAULT_CATEGORY


def category_set(names: Iterable[str]) -> frozenset[str]:
    """Configured category names (protected, guaranteed) as stored facts spell them."""
    return frozenset(
        normalise_category(name) for name in names if isinstance(name, str) and name.strip()
    )


def parse_confidence(value: Any, *, clamp: bool = True) -> float | None:
    """A confidence from a number or a numeric string; None when unusable (missing, a bool,
    not a number, not finite, or — without ``clamp`` — outside [0, 1]). With ``clamp`` a number
    outside [0, 1] is brought to the nearest bound (a model's 1.5 means "very sure")."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, str):
        try:
            value = float(value.strip())
        except ValueError:
            return None
    if not isinstance(value, int | float) or not math.isfinite(value):
        return None
    number = float(value)
    if clamp:
        return min(1.0, max(0.0, number))
    return number if 0.0 <= number <= 1.0 else None


def parse_timestamp(value: Any) -> datetime | None:
    """ISO-8601 (``Z`` accepted, naive read as UTC) → aware datetime; blank/invalid → None."""
    if value is None or value == "":
        return None
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=UTC)
    if not isinstance(value, str):
        return None
    try:
        parsed = datetime.fromisoformat(value.strip().replace("Z", "+00:00"))
    except ValueError:
        return None
    return parsed if parsed.tzinfo else parsed.replace(tzinfo=UTC)


# An event's date as a fact keeps it: a day, or only its month or year when that is all the
# conversation says ("in May 2023", "in 2022"); years 1000-9999.
_EVENT_DATE = re.compile(r"([1-9]\d{3})(?:-(\d{2})(?:-(\d{2}))?)?")
MAX_EVENT_DATE_CHARS = 40


def parse_event_date(value: Any) -> str | None:
    """``YYYY-MM-DD``, ``YYYY-MM`` or ``YYYY`` (the start of an ISO date-time is its day), or
    None for anything else: an event date that cannot be read is no event date, never a lost
    fact."""
    if isinstance(value, datetime):
        return value.date().isoformat()
    if isinstance(value, date):
        return value.isoformat()
    if not isinstance(value, str) or len(value) > MAX_EVENT_DATE_CHARS:
        return None
    text = value.strip()
    found = _EVENT_DATE.fullmatch(text[:10] if len(text) > 10 and text[10] in "T " else text)
    if found is None:
        return None
    year, month, day = found.group(1), found.group(2), found.group(3)
    try:
        if day is not None:
            return date(int(year), int(month), int(day)).isoformat()
        if month is not None:
            return f"{year}-{month}" if 1 <= int(month) <= 12 else None
    except ValueError:
        return None
    return year
