"""When a message was said: reading the timestamp an agent attached to it, bounded and validated.

Agents attach times in every shape: ISO 8601 text (``2023-05-08T13:56:00Z``, an offset, or naive —
read as UTC), epoch seconds or milliseconds (numbers or numeric text), ``datetime`` objects. One
function reads them all into epoch milliseconds, the unit memq keeps in Redis; anything else — a
huge string, year 99999, NaN, a bool, a date before 1970 — is no time at all (``None``), and the
caller falls back to the hand-off time and counts it. Reading costs at most
:data:`MAX_TIMESTAMP_CHARS` characters of work per message, whatever was sent.
"""

from __future__ import annotations

import math
from datetime import UTC, date, datetime

# The times a message may carry: from the epoch to the last millisecond of year 9999 (what a
# ``datetime`` can hold). A time outside is garbage, never clamped to a bound.
EARLIEST_MS = 0
LATEST_MS = 253_402_300_799_999
# The longest timestamp text read: ISO 8601 with nanoseconds and an offset is 35 characters.
MAX_TIMESTAMP_CHARS = 64
# A number at or above this is epoch milliseconds; below, epoch seconds (1e11 seconds is year
# 5138, 1e11 milliseconds is March 1973: no real message time is ambiguous).
_MILLISECONDS_FROM = 100_000_000_000


def timestamp_ms(value: object) -> int | None:
    """``value`` as epoch milliseconds, or None when it is no usable time (see the module)."""
    if value is None or isinstance(value, bool):
        return None
    if isinstance(value, datetime):
        return _datetime_ms(value)
    if isinstance(value, date):  # a bare date: its midnight, UTC
        return _datetime_ms(datetime(value.year, value.month, value.day, tzinfo=UTC))
    if isinstance(value, int | float):
        return _epoch_ms(value)
    if not isinstance(value, str):
        return None
    text = value.strip()
    if not text or len(text) > MAX_TIMESTAMP_CHARS:
        return None
    try:
        return _epoch_ms(float(text))
    except ValueError:
        pass
    try:
        parsed = datetime.fromisoformat(text.replace("z", "Z").replace("Z", "+00:00"))
    except ValueError:
        return None
    return _datetime_ms(parsed)


def _epoch_ms(number: float) -> int | None:
    if not math.isfinite(number):
        return None
    ms = int(number if abs(number) >= _MILLISECONDS_FROM else number * 1000)
    return ms if EARLIEST_MS <= ms <= LATEST_MS else None


def _datetime_ms(moment: datetime) -> int | None:
    aware = moment if moment.tzinfo is not None else moment.replace(tzinfo=UTC)
    try:
        ms = int(aware.timestamp() * 1000)
    except (OverflowError, ValueError, OSError):
        return None
    return ms if EARLIEST_MS <= ms <= LATEST_MS else None


def stored_ms(value: object) -> int | None:
    """Epoch milliseconds as memq itself stored them (a number within the bounds), else None:
    what a reader of memq's own records uses, never a failed read."""
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return None
    return int(value) if EARLIEST_MS <= value <= LATEST_MS else None


def ms_datetime(ms: int) -> datetime:
    """Epoch milliseconds as an aware UTC datetime."""
    return datetime.fromtimestamp(ms / 1000, UTC)


def day_of(moment: datetime) -> str:
    """The UTC day of ``moment``, ``YYYY-MM-DD``: how prompts and blocks name a day."""
    return moment.astimezone(UTC).date().isoformat()
