"""The guard against the next slip: each ratio of a run against the last committed figures.

A full ``make bench`` writes every benchmark's ratios to ``docs/benchmarks.json`` beside
``docs/benchmarks.md``; the next run (a full one, or ``--only`` a few) reads them back and prints
each ratio's change. A ratio that got worse by more than :data:`SLIP` of its committed value is a
slip, and the run says so before anything else in its summary (and at the top of the document it
writes). Ratios, not timings: each is measured against a baseline in the same run, so a slower
host moves both sides. The guard prints; it never fails a test, and nothing here times anything.

Pure functions over plain data (tested without running a benchmark); reading and writing the file
is at the edges.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

SLIP = 0.15  # a ratio worse by more than this share of its committed value is reported
FORMAT = 1

Better = Literal["higher", "lower"]


@dataclass(frozen=True, slots=True)
class Ratio:
    """One ratio a benchmark reports: its value, which way is better, and the spread the run
    itself saw (``band``: low and high of the per-round ratios, when it has rounds)."""

    value: float
    better: Better
    band: tuple[float, float] | None = None


@dataclass(frozen=True, slots=True)
class Change:
    """One ratio against its committed value: ``worse`` is the relative loss (negative: a gain)."""

    key: str
    name: str
    before: float
    after: Ratio

    @property
    def worse(self) -> float:
        if self.before == 0:
            return 0.0
        loss = (self.before - self.after.value) / abs(self.before)
        return loss if self.after.better == "higher" else -loss

    @property
    def slipped(self) -> bool:
        return self.worse > SLIP

    @property
    def within_noise(self) -> bool:
        """The committed value lies inside the spread this run saw, or moved less than the slip
        threshold when the run has no spread of its own."""
        band = self.after.band
        if band is None:
            return abs(self.worse) <= SLIP
        return band[0] <= self.before <= band[1]


def band_of(samples: Iterable[float], low: float = 10, high: float = 90) -> tuple[float, float]:
    """The ``low``–``high`` percentile range of per-round ratios (nearest rank)."""
    ordered = sorted(samples)
    if not ordered:
        raise ValueError("no samples")

    def at(pct: float) -> float:
        rank = max(0, min(len(ordered) - 1, round(pct / 100 * len(ordered) + 0.5) - 1))
        return ordered[rank]

    return at(low), at(high)


def compare(
    ratios: Mapping[str, Mapping[str, Ratio]], committed: Mapping[str, Mapping[str, float]]
) -> list[Change]:
    """Every ratio of this run that has a committed value, in the run's order."""
    return [
        Change(key, name, committed[key][name], ratio)
        for key, named in ratios.items()
        for name, ratio in named.items()
        if name in committed.get(key, {})
    ]


def _fmt(value: float) -> str:
    return f"{value:.3g}"


def describe(change: Change) -> str:
    after = change.after
    band = f" (this run's band {_fmt(after.band[0])}–{_fmt(after.band[1])})" if after.band else ""
    verdict = "SLIPPED" if change.slipped else ("noise" if change.within_noise else "moved")
    direction = "worse" if change.worse > 0 else "better"
    return (
        f"{change.key} {change.name}: {_fmt(change.before)} → {_fmt(after.value)}{band}, "
        f"{abs(change.worse):.0%} {direction} ({after.better} is better) — {verdict}"
    )


def headline(changes: list[Change]) -> list[str]:
    """What the run says first: every slip, or that there was none."""
    slips = [c for c in changes if c.slipped]
    if not changes:
        return ["guard: no committed figures to compare with (docs/benchmarks.json)"]
    if not slips:
        return [f"guard: no ratio fell by more than {SLIP:.0%} against the committed figures"]
    return [
        f"GUARD: {len(slips)} ratio(s) fell by more than {SLIP:.0%} since the committed run:"
    ] + ["  " + describe(c) for c in slips]


def to_json(ratios: Mapping[str, Mapping[str, Ratio]]) -> dict[str, Any]:
    return {
        "format": FORMAT,
        "ratios": {
            key: {
                name: {
                    "value": r.value,
                    "better": r.better,
                    **({"band": list(r.band)} if r.band else {}),
                }
                for name, r in named.items()
            }
            for key, named in ratios.items()
            if named
        },
    }


def committed_values(data: Mapping[str, Any]) -> dict[str, dict[str, float]]:
    """The committed value of each ratio in a ``docs/benchmarks.json`` document."""
    if data.get("format") != FORMAT:
        return {}
    return {
        str(key): {str(name): float(entry["value"]) for name, entry in named.items()}
        for key, named in dict(data.get("ratios", {})).items()
    }


def merged(
    data: Mapping[str, Any], ratios: Mapping[str, Mapping[str, Ratio]], extra: Mapping[str, Any]
) -> dict[str, Any]:
    """``data`` with the benchmarks of this run replaced by its ratios (the others kept)."""
    fresh = to_json(ratios)
    old = dict(data.get("ratios", {})) if data.get("format") == FORMAT else {}
    old.update(fresh["ratios"])
    return {"format": FORMAT, **extra, "ratios": old}


def read(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def write(path: Path, data: Mapping[str, Any]) -> None:
    path.write_text(json.dumps(data, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")
