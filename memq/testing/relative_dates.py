"""How the scripted models resolve a relative time, deterministically: what the update prompt asks
a real model to do ("last Saturday", said on Monday 2023-05-08, is 2023-05-06), for the few
phrases tests use. Also reads the prompt's ``Date:`` lines back, so a scripted answer knows the
day of each labelled message."""

from __future__ import annotations

import re
from datetime import date, timedelta

_WEEKDAYS = ("monday", "tuesday", "wednesday", "thursday", "friday", "saturday", "sunday")
_NUMBERS = {"one": 1, "two": 2, "three": 3, "four": 4, "five": 5, "a": 1}
_LAST_WEEKDAY = re.compile(r"\blast (" + "|".join(_WEEKDAYS) + r")\b", re.IGNORECASE)
_DAYS_AGO = re.compile(r"\b(\d+|one|two|three|four|five|a) days? ago\b", re.IGNORECASE)
_YESTERDAY = re.compile(r"\byesterday\b", re.IGNORECASE)
_TODAY = re.compile(r"\btoday\b", re.IGNORECASE)
_DAY_LINE = re.compile(r"^Date: (\d{4}-\d{2}-\d{2}) \(\w+\)$")
_LABEL = re.compile(r"^\[(m\d+)\] ")


def resolve_relative(text: str, said: date) -> date | None:
    """The day a relative time in ``text`` means, said on ``said``; None when it has none."""
    found = _LAST_WEEKDAY.search(text)
    if found is not None:
        wanted = _WEEKDAYS.index(found.group(1).lower())
        back = (said.weekday() - wanted) % 7 or 7
        return said - timedelta(days=back)
    found = _DAYS_AGO.search(text)
    if found is not None:
        word = found.group(1).lower()
        return said - timedelta(days=int(word) if word.isdigit() else _NUMBERS[word])
    if _YESTERDAY.search(text):
        return said - timedelta(days=1)
    if _TODAY.search(text):
        return said
    return None


def message_days(conversation: str) -> dict[str, date]:
    """Each labelled message's day, from the ``Date:`` line above it in a ``<conversation>``."""
    days: dict[str, date] = {}
    current: date | None = None
    for line in conversation.splitlines():
        day = _DAY_LINE.match(line)
        if day is not None:
            current = date.fromisoformat(day.group(1))
            continue
        label = _LABEL.match(line)
        if label is not None and current is not None:
            days[label.group(1)] = current
    return days
