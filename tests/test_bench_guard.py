"""The benchmark guard's comparison logic (bench/guard.py): which way a ratio moved against the
committed figures, when that is a slip, and what the run says first. No benchmark runs here and
nothing is timed."""

from __future__ import annotations

from pathlib import Path

import pytest

from bench import guard
from bench.guard import Ratio


@pytest.mark.parametrize(
    ("before", "after", "better", "slipped"),
    [
        (0.70, 0.58, "higher", True),  # a rate ratio fell 17 %
        (0.70, 0.61, "higher", False),  # 13 %: inside the threshold
        (0.70, 0.90, "higher", False),  # a gain
        (0.50, 0.60, "lower", True),  # a cost ratio rose 20 %
        (0.50, 0.40, "lower", False),
    ],
)
def test_a_ratio_slips_when_it_gets_worse_by_more_than_15_percent(
    before: float, after: float, better: guard.Better, slipped: bool
) -> None:
    change = guard.compare({"P1": {"r": Ratio(after, better)}}, {"P1": {"r": before}})[0]
    assert change.slipped is slipped


def test_the_headline_names_every_slip_and_only_slips() -> None:
    ratios = {
        "P1": {"rate": Ratio(0.40, "higher")},
        "P7": {"inject": Ratio(0.45, "lower")},
        "P6": {"share": Ratio(0.14, "lower")},
    }
    committed = {"P1": {"rate": 0.70}, "P7": {"inject": 0.44}, "P6": {"share": 0.10}}
    lines = guard.headline(guard.compare(ratios, committed))
    assert lines[0].startswith("GUARD: 2 ratio(s) fell")
    assert any(line.strip().startswith("P1 rate") for line in lines)
    assert any(line.strip().startswith("P6 share") for line in lines)
    assert not any("P7" in line for line in lines)


def test_a_run_without_slips_says_so_and_one_without_figures_says_that() -> None:
    ratios = {"P1": {"rate": Ratio(0.72, "higher")}}
    assert "no ratio fell" in guard.headline(guard.compare(ratios, {"P1": {"rate": 0.70}}))[0]
    assert "no committed figures" in guard.headline(guard.compare(ratios, {}))[0]


def test_noise_is_the_run_s_own_band_when_it_has_one() -> None:
    inside = Ratio(0.60, "higher", band=(0.55, 0.72))
    outside = Ratio(0.60, "higher", band=(0.55, 0.65))
    assert guard.compare({"P1": {"r": inside}}, {"P1": {"r": 0.70}})[0].within_noise
    assert not guard.compare({"P1": {"r": outside}}, {"P1": {"r": 0.70}})[0].within_noise


def test_a_partial_run_replaces_its_own_figures_and_keeps_the_others(tmp_path: Path) -> None:
    path = tmp_path / "benchmarks.json"
    first = {"P1": {"rate": Ratio(0.7, "higher", (0.6, 0.8))}, "P7": {"x": Ratio(0.4, "lower")}}
    guard.write(path, guard.merged({}, first, {"written": "t0"}))
    guard.write(path, guard.merged(guard.read(path), {"P1": {"rate": Ratio(0.75, "higher")}}, {}))
    assert guard.committed_values(guard.read(path)) == {"P1": {"rate": 0.75}, "P7": {"x": 0.4}}


def test_an_unreadable_or_foreign_file_compares_with_nothing(tmp_path: Path) -> None:
    path = tmp_path / "benchmarks.json"
    path.write_text("{not json", encoding="utf-8")
    assert guard.committed_values(guard.read(path)) == {}
    assert guard.committed_values({"format": 99, "ratios": {"P1": {"r": {"value": 1}}}}) == {}


def test_the_band_is_the_10th_to_90th_percentile_of_the_rounds() -> None:
    assert guard.band_of([float(i) for i in range(1, 101)]) == (10.0, 90.0)
