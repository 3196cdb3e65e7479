"""The time a question names, and the days a fact's event date covers: what recall's ranking
by time (:data:`storage.search.DATE_WEIGHT`) compares.

Explicit times only, the most precise first: a day ("1 February, 2023", "May 25, 2023",
"2023-05-08", "2023年5月8日"), a month of a year ("December 2023", "2023年5月"), a year ("in
2023"). A month without its year ("in June") or a relative time ("last weekend") would need a
"now" the ranking has not.
"""

from __future__ import annotations

import functools
import re
import unicodedata
from datetime import date, timedelta

# Distinct questions whose named time is kept (a question is ranked once per recall it serves).
_QUERY_CACHE_SIZE = 20_000

_MONTH_NAMES = (
    "january", "february", "march", "april", "may", "june",
    "july", "august", "september", "october", "november", "december",
)  # fmt: skip
# Each month by its name, its first three letters ("dec", "dec.") and "sept".
_MONTHS = {name: number for number, full in enumerate(_MONTH_NAMES, 1) for name in (full, full[:3])}
_MONTHS["sept"] = 9
_MONTH = r"(" + "|".join(sorted(_MONTHS, key=len, reverse=True)) + r")\.?"
_YEAR = r"([12]\d{3})"
_ORDINAL = r"(\d{1,2})(?:st|nd|rd|th)?"
# Explicit times only, the most precise first: a day, a month of a year, a year. A month without
# its year ("in June") or a relative time ("last weekend") would need a "now" the ranking has
# not; dateutil's fuzzy parser reads any number as a day ("3 things" → the 3rd) and fills what
# is missing from today, so the forms are spelt out here.
_DAYS = (
    ("ymd", re.compile(r"(?<![\d-])([12]\d{3})-(\d{1,2})-(\d{1,2})(?![\d-])")),
    ("dmy", re.compile(rf"\b{_ORDINAL}\s+(?:of\s+)?{_MONTH},?\s+{_YEAR}\b")),
    ("mdy", re.compile(rf"\b{_MONTH}\s+{_ORDINAL},?\s+{_YEAR}\b")),
    ("ymd", re.compile(r"(?<!\d)([12]\d{3})\s*年\s*(\d{1,2})\s*月\s*(\d{1,2})\s*[日号]")),
)
_MONTHS_OF_YEARS = (
    ("my", re.compile(rf"\b{_MONTH},?\s+(?:of\s+)?{_YEAR}\b")),
    ("ym", re.compile(r"(?<!\d)([12]\d{3})\s*年\s*(\d{1,2})\s*月")),
)
_YEARS = (
    re.compile(rf"\b(?:in|during)\s+(?:the\s+year\s+)?{_YEAR}\b"),
    re.compile(r"(?<!\d)([12]\d{3})\s*年"),
)


@functools.lru_cache(maxsize=_QUERY_CACHE_SIZE)
def named_days(query: str) -> tuple[date, date] | None:
    """The first and last day of the time ``query`` names explicitly — a day ("1 February,
    2023", "May 25, 2023", "2023-05-08", "2023年5月8日"), a month of a year ("December 2023",
    "2023年5月") or a year ("in 2023") — the most precise one it names (an impossible day, "31
    April, 2023", names its month); None when it names none."""
    text = unicodedata.normalize("NFKC", query).casefold()
    for order, pattern in _DAYS:
        for found in pattern.finditer(text):
            parts = dict(zip(order, found.groups(), strict=True))
            try:
                day = date(int(parts["y"]), _month(parts["m"]), int(parts["d"]))
            except ValueError:
                continue
            return day, day
    for order, pattern in _MONTHS_OF_YEARS:
        for found in pattern.finditer(text):
            parts = dict(zip(order, found.groups(), strict=True))
            year, month = int(parts["y"]), _month(parts["m"])
            if 1 <= month <= 12:
                return _month_span(year, month)
    for pattern in _YEARS:
        if (named_year := pattern.search(text)) is not None:
            year = int(named_year.group(1))
            return date(year, 1, 1), date(year, 12, 31)
    return None


def _month(text: str) -> int:
    return int(text) if text.isdigit() else _MONTHS[text]


def _month_span(year: int, month: int) -> tuple[date, date]:
    if month == 12:  # not through January of the next year: 9999's has none
        return date(year, 12, 1), date(year, 12, 31)
    return date(year, month, 1), date(year, month + 1, 1) - timedelta(days=1)


def event_span(event_date: str) -> tuple[date, date]:
    """The days a fact's event date (``YYYY-MM-DD``, ``YYYY-MM`` or ``YYYY``,
    :func:`storage.vocabulary.parse_event_date`) covers."""
    parts = [int(part) for part in event_date.split("-")]
    if len(parts) == 3:
        day = date(parts[0], parts[1], parts[2])
        return day, day
    if len(parts) == 2:
        return _month_span(parts[0], parts[1])
    return date(parts[0], 1, 1), date(parts[0], 12, 31)
