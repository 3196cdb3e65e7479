"""One agent replica of the soak: ``python -m bench.soak.agent PLAN.json``.

It talks to its own share of the conversations at a steady rate through ``producer.MemoryProducer``
(settings from the MEMQ_* environment), and records every turn it handed over: its marker, and
whether Redis acknowledged a hand-over carrying it or it was only spooled. A flush (~10 % of turns)
is followed by a summarisation: the thread keeps only its last messages, as an agent's history
does, so the queue must not lose what was pending.

The harness steers it through files in the control folder: ``forget`` lists users to stop talking
to (acknowledged in ``forget-ack-<index>`` once no turn of theirs is in flight and the spool is
empty), ``stop`` ends the run; the producer is then closed (its spool drained) and the turns are
written to ``turns-<index>.jsonl`` with a ``stats-<index>.json`` summary.
"""

from __future__ import annotations

import json
import random
import secrets
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from memq.core.settings import MemqSettings
from memq.testing.waiting import DEADLINE_SECONDS
from producer import MemoryProducer

KEEP_AFTER_SUMMARY = 2


@dataclass
class Conversation:
    thread: str
    user: str
    agent: str | None
    messages: list[dict[str, str]]


@dataclass
class TurnRecord:
    marker: str
    user: str
    agent: str | None
    thread: str
    produced_ms: int
    acked: bool = False
    last_ack_ms: int | None = None
    spooled: bool = False  # the latest hand-over carrying it was spooled
    ever_spooled: bool = False
    summarised: bool = False  # the agent's history dropped it after a flush (a summary)


def now_ms() -> int:
    return time.time_ns() // 1_000_000


def read_lines(path: Path) -> set[str]:
    try:
        return {line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line}
    except FileNotFoundError:
        return set()


def run(plan: dict[str, Any]) -> int:
    index = int(plan["index"])
    control = Path(plan["control_dir"])
    rng = random.Random(int(plan["seed"]))
    conversations = [
        Conversation(c["thread"], c["user"], c["agent"], []) for c in plan["conversations"]
    ]
    rate = float(plan["rate"])
    flush_fraction = float(plan["flush_fraction"])
    turns: dict[str, TurnRecord] = {}
    forgotten: set[str] = set()
    producer = MemoryProducer(MemqSettings())
    started = time.monotonic()
    sent = 0
    try:
        while not (control / "stop").exists():
            wanted = read_lines(control / "forget")
            if wanted - forgotten:
                forgotten |= wanted
                # Nothing of theirs may still be on its way: the spool is replayed first.
                deadline = time.monotonic() + DEADLINE_SECONDS
                while producer.spool_size and time.monotonic() < deadline:
                    producer.drain_spool()
                    time.sleep(0.1)  # wait-ok: the replay backs off while Redis is away
                ack = {"users": sorted(forgotten), "spool": producer.spool_size}
                (control / f"forget-ack-{index}.tmp").write_text(json.dumps(ack))
                (control / f"forget-ack-{index}.tmp").rename(control / f"forget-ack-{index}")
            live = [c for c in conversations if c.user not in forgotten]
            if live:
                turn_once(producer, rng.choice(live), rng.random() < flush_fraction, turns)
            sent += 1
            pause = started + sent / rate - time.monotonic()
            if pause > 0:
                time.sleep(pause)  # wait-ok: the producer's steady turn rate
    finally:
        producer.close()  # drains the spool, bounded by the socket timeouts
        stats = asdict(producer.stats) | {"spool_left": producer.spool_size, "turns": len(turns)}
        with (control / f"turns-{index}.jsonl").open("w", encoding="utf-8") as out:
            for record in turns.values():
                out.write(json.dumps(asdict(record)) + "\n")
        (control / f"stats-{index}.json").write_text(json.dumps(stats))
    return 0


def turn_once(
    producer: MemoryProducer, conv: Conversation, flush: bool, turns: dict[str, TurnRecord]
) -> None:
    marker = f"M-{secrets.token_hex(6)}"
    conv.messages.append(
        {"id": f"{marker}-u", "role": "user", "content": f"Please remember the code {marker}."}
    )
    conv.messages.append({"id": f"{marker}-a", "role": "assistant", "content": "Noted, thanks."})
    stamp = now_ms()
    turns[marker] = TurnRecord(marker, conv.user, conv.agent, conv.thread, produced_ms=stamp)
    send = producer.flush if flush else producer.after_agent
    acked = send(conv.thread, conv.user, conv.agent, conv.messages)
    done = now_ms()
    for message in conv.messages:
        record = turns.get(message["id"][:-2])
        if record is None:
            continue
        if acked:
            record.acked, record.last_ack_ms, record.spooled = True, done, False
        else:
            record.spooled = record.ever_spooled = True
    if flush:
        for message in conv.messages[:-KEEP_AFTER_SUMMARY]:
            record = turns.get(message["id"][:-2])
            if record is not None:
                record.summarised = True
        del conv.messages[:-KEEP_AFTER_SUMMARY]


def main(argv: list[str]) -> int:
    plan = json.loads(Path(argv[0]).read_text(encoding="utf-8"))
    return run(plan)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
