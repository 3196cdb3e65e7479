"""``python -m bench.soak --minutes N --rate R --threads T --users U --agents A
--appendfsync everysec|always [--report]``: the chaos soak (exit 1 on any lost, duplicated or
invalid item). ``make soak`` runs the defaults."""

from __future__ import annotations

import argparse
import sys
import tempfile
from pathlib import Path

from bench.soak.harness import SoakConfig, run_soak
from bench.soak.report import append_to_doc, render

DOC = Path(__file__).resolve().parents[2] / "docs" / "reliability.md"


def parse_args(argv: list[str]) -> argparse.Namespace:
    d = SoakConfig()
    p = argparse.ArgumentParser(prog="python -m bench.soak", description=__doc__)
    p.add_argument("--minutes", type=float, default=d.minutes)
    p.add_argument("--rate", type=float, default=d.rate, help="turns per second, all agents")
    p.add_argument("--threads", type=int, default=d.threads, help="conversations")
    p.add_argument("--users", type=int, default=d.users)
    p.add_argument("--agents", type=int, default=d.agents, help="agent names")
    p.add_argument("--producers", type=int, default=d.producers, help="agent replica processes")
    p.add_argument("--appendfsync", choices=("everysec", "always"), default=d.appendfsync)
    p.add_argument("--prefork-concurrency", type=int, default=d.prefork_concurrency)
    p.add_argument("--thread-concurrency", type=int, default=d.thread_concurrency)
    p.add_argument("--lease", type=float, default=d.lease_seconds, help="lease seconds")
    p.add_argument("--debounce", type=float, default=d.debounce_seconds)
    p.add_argument("--tick", type=float, default=d.tick_seconds)
    p.add_argument("--flush-fraction", type=float, default=d.flush_fraction)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--work-dir", type=Path, default=None, help="default: a fresh temp folder")
    p.add_argument("--report", action="store_true", help=f"append the report to {DOC.name}")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    work = args.work_dir or Path(tempfile.mkdtemp(prefix="memq-soak-"))
    config = SoakConfig(
        minutes=args.minutes,
        rate=args.rate,
        threads=args.threads,
        users=args.users,
        agents=args.agents,
        producers=args.producers,
        appendfsync=args.appendfsync,
        prefork_concurrency=args.prefork_concurrency,
        thread_concurrency=args.thread_concurrency,
        lease_seconds=args.lease,
        debounce_seconds=args.debounce,
        tick_seconds=args.tick,
        flush_fraction=args.flush_fraction,
        seed=args.seed,
        work_dir=work,
        log=lambda line: print(line, flush=True),
    )
    print(f"soak: logs and data in {work}", flush=True)
    result = run_soak(config)
    lines = render(result)
    print("\n".join(lines), flush=True)
    if args.report:
        append_to_doc(lines, DOC)
        print(f"report appended to {DOC}")
    return 0 if result.passed else 1


if __name__ == "__main__":
    sys.exit(main())
