"""The flaky check's bookkeeping: JUnit reports in, per-test failure counts out."""

from __future__ import annotations

from pathlib import Path

from tests.flaky_check import RunOutcome, parse_junit, report

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.test_a" name="test_ok" time="0.1"/>
<testcase classname="tests.test_a" name="test_flaky" time="0.2">
<failure message="AssertionError: timed out after 10s waiting for the fact&#10;more">x</failure>
</testcase>
<testcase classname="tests.test_b" name="test_setup" time="0.0">
<error message="">boom</error></testcase>
</testsuite></testsuites>
"""


def test_parse_junit_names_each_failure_with_its_first_line(tmp_path: Path) -> None:
    path = tmp_path / "run.xml"
    path.write_text(JUNIT, encoding="utf-8")
    ran, failed = parse_junit(path)
    assert ran == {"tests.test_a::test_ok", "tests.test_a::test_flaky", "tests.test_b::test_setup"}
    assert failed == {
        "tests.test_a::test_flaky": (
            "failure: AssertionError: timed out after 10s waiting for the fact"
        ),
        "tests.test_b::test_setup": "error: boom",
    }
    assert parse_junit(tmp_path / "missing.xml") == (set(), {})


def test_report_counts_failures_per_test_and_those_beside_the_hog() -> None:
    flaky = "tests.test_a::test_flaky"
    runs = [
        RunOutcome(1, False, 0, 10.0, {flaky}),
        RunOutcome(2, True, 1, 12.0, {flaky}, {flaky: "failure: timed out"}),
        RunOutcome(3, True, 1, 12.0, {flaky}, {flaky: "failure: timed out"}),
    ]
    text = report(runs)
    assert f"2/3 (2 hog)  {flaky}" in text
    assert "run 2 (cpu hog): 1 tests, 1 failed, exit 1" in text
    assert "no test failed in 1 runs" in report(runs[:1])
