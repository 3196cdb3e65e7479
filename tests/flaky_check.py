"""``python -m tests.flaky_check [--runs N] [--hog-runs K] [-- PYTEST_ARGS]``: run the suite
several times, the last K runs beside a CPU hog, and report how often each test failed.

A test that fails in one run out of several is a test that will fail someone's CI at random: the
report names it with its failure count and the first line of each failure, so it can be made to
wait for its real precondition. The hog (one busy-looping process per ``--hog-procs``) stands in
for a loaded CI machine, where timing guesses break first. Each run writes a JUnit XML report to
a scratch folder; nothing else is kept. Exit 1 when any test failed in any run.

    python -m tests.flaky_check --runs 3 --hog-runs 2 -- -m "e2e or reliability"
"""

from __future__ import annotations

import argparse
import contextlib
import signal
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections import Counter, defaultdict
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parents[1]
_HOG_SOURCE = "while True:\n    pass\n"
_INTERRUPT_GRACE_SECONDS = 60.0


@dataclass
class RunOutcome:
    """One pytest run: the tests it ran, and the first line of each failure by test id."""

    number: int
    hog: bool
    exit_code: int
    seconds: float
    ran: set[str] = field(default_factory=set)
    failed: dict[str, str] = field(default_factory=dict)


def parse_junit(path: Path) -> tuple[set[str], dict[str, str]]:
    """Test ids run and failed (failure or error, first line of its message) in a JUnit report."""
    ran: set[str] = set()
    failed: dict[str, str] = {}
    if not path.exists():
        return ran, failed
    for case in ET.parse(path).getroot().iter("testcase"):
        test_id = f"{case.get('classname', '')}::{case.get('name', '')}"
        ran.add(test_id)
        for tag in ("failure", "error"):
            problem = case.find(tag)
            if problem is not None:
                message = (problem.get("message") or problem.text or tag).strip()
                failed[test_id] = f"{tag}: {message.splitlines()[0] if message else tag}"[:200]
                break
    return ran, failed


@contextlib.contextmanager
def cpu_hog(processes: int) -> Iterator[None]:
    """Busy-looping interpreters for the duration of the block; always stopped (by their pid)."""
    hogs = [
        subprocess.Popen([sys.executable, "-c", _HOG_SOURCE], stdin=subprocess.DEVNULL)
        for _ in range(processes)
    ]
    try:
        yield
    finally:
        for hog in hogs:
            hog.kill()
        for hog in hogs:
            hog.wait(timeout=10)


def run_once(
    number: int, hog: bool, hog_procs: int, pytest_args: list[str], scratch: Path
) -> RunOutcome:
    report = scratch / f"run-{number}.xml"
    command = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider"]
    command += [f"--junitxml={report}", *pytest_args]
    started = time.monotonic()
    with cpu_hog(hog_procs if hog else 0):
        # A run started from a background shell inherits an ignored SIGINT: restore it, so an
        # interrupted check stops pytest through its own teardown (which stops what it started).
        pytest = subprocess.Popen(
            command,
            cwd=REPO_ROOT,
            stdin=subprocess.DEVNULL,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )
        try:
            code = pytest.wait()
        except BaseException:
            pytest.send_signal(signal.SIGINT)
            try:
                pytest.wait(timeout=_INTERRUPT_GRACE_SECONDS)
            except subprocess.TimeoutExpired:
                pytest.kill()
            raise
    ran, failed = parse_junit(report)
    return RunOutcome(number, hog, code, time.monotonic() - started, ran, failed)


def report(outcomes: list[RunOutcome]) -> str:
    """Per-test failure counts over the runs, most frequent first."""
    counts: Counter[str] = Counter()
    reasons: dict[str, list[str]] = defaultdict(list)
    hogged: Counter[str] = Counter()
    for outcome in outcomes:
        for test_id, reason in outcome.failed.items():
            counts[test_id] += 1
            hogged[test_id] += int(outcome.hog)
            reasons[test_id].append(f"run {outcome.number}: {reason}")
    lines = ["", "== flaky check"]
    for outcome in outcomes:
        lines.append(
            f"run {outcome.number}{' (cpu hog)' if outcome.hog else ''}: "
            f"{len(outcome.ran)} tests, {len(outcome.failed)} failed, exit {outcome.exit_code}, "
            f"{outcome.seconds:.0f} s"
        )
    if not counts:
        lines.append(f"no test failed in {len(outcomes)} runs")
        return "\n".join(lines)
    lines.append("failures per test (runs failed / runs, of which beside the hog):")
    for test_id, count in counts.most_common():
        lines.append(f"  {count}/{len(outcomes)} ({hogged[test_id]} hog)  {test_id}")
        lines.extend(f"      {reason}" for reason in reasons[test_id])
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.flaky_check", description=__doc__)
    parser.add_argument("--runs", type=int, default=4, help="how many times to run the suite")
    parser.add_argument(
        "--hog-runs", type=int, default=2, help="how many of the runs (the last ones) get a hog"
    )
    parser.add_argument(
        "--hog-procs", type=int, default=1, help="busy-looping processes beside a hogged run"
    )
    parser.add_argument("pytest_args", nargs="*", help="passed to pytest (after --)")
    args = parser.parse_args(argv)
    if args.runs < 1 or not 0 <= args.hog_runs <= args.runs or args.hog_procs < 1:
        parser.error("need --runs >= 1, 0 <= --hog-runs <= --runs and --hog-procs >= 1")
    # SIGTERM unwinds like Ctrl-C: the hog and the pytest run are stopped on the way out.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    outcomes: list[RunOutcome] = []
    with tempfile.TemporaryDirectory(prefix="memq-flaky-") as scratch:
        for number in range(1, args.runs + 1):
            hog = number > args.runs - args.hog_runs
            print(f"== run {number}/{args.runs}{' beside a CPU hog' if hog else ''}", flush=True)
            outcomes.append(run_once(number, hog, args.hog_procs, args.pytest_args, Path(scratch)))
            print(report(outcomes[-1:]), flush=True)
    print(report(outcomes))
    broken = any(o.failed or (o.exit_code not in (0, 5) and not o.ran) for o in outcomes)
    return 1 if broken else 0


if __name__ == "__main__":
    sys.exit(main())
