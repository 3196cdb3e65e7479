"""The `memq` CLI, in-process through `main(argv)` against the real redis-server fixture, plus a
subprocess check of what an operator sees when Redis is down."""

from __future__ import annotations

import base64
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
import redis

from memq.cli import main
from memq.core.identity import ContextKey
from memq.core.keys import KeySchema
from memq.core.settings import MemqSettings
from memq.local.redis_server import RedisServer, free_port
from memq.testing.waiting import DEADLINE_SECONDS, wait_for
from producer.producer import MemoryProducer
from tests.support.cli import Run, assert_one_line_error, write_json
from tests.support.openai_server import ScriptedOpenAI
from tests.support.started_queue import StartingQueue

pytestmark = pytest.mark.integration

CONVERSATION = [
    {"role": "user", "content": "I am Carol and I write Rust for embedded devices."},
    {"role": "assistant", "content": "Nice, what are you building?"},
]


# --- errors
def test_unreachable_redis_is_one_masked_line(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    url = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    monkeypatch.setenv("MEMQ_REDIS_URL", url)
    code, out, err = run("stats")
    assert_one_line_error(code, err, "cannot reach Redis at redis://:***@127.0.0.1:")
    assert "hunter2" not in out + err


def test_unreachable_redis_in_a_real_process_has_no_traceback(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    env["MEMQ_REDIS_URL"] = f"redis://:hunter2@127.0.0.1:{free_port()}/0"
    script = Path(sys.executable).with_name("memq")
    done = subprocess.run(
        [str(script), "stats"],
        env=env,
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=DEADLINE_SECONDS,
    )
    assert done.returncode == 1
    assert_one_line_error(done.returncode, done.stderr, "memq stats: cannot reach Redis")
    assert "hunter2" not in done.stdout + done.stderr


def test_invalid_setting_is_one_line(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMQ_DEBOUNCE_SECONDS", "soon")
    code, _, err = run("stats")
    assert_one_line_error(code, err, "MEMQ_DEBOUNCE_SECONDS: not a number: 'soon'")


# --- enqueue, stats, dead
def test_enqueue_a_json_file(
    run: Run, cli_env: MemqSettings, redis_client: redis.Redis, tmp_path: Path
) -> None:
    path = write_json(tmp_path / "chat.json", {"messages": CONVERSATION})
    code, out, err = run("enqueue", path, "--thread", "t-1", "--user", "carol", "--flush")
    assert (code, err) == (0, "")
    context_id = ContextKey.create("t-1", "carol", None).id
    assert f"enqueued {context_id} version 1" in out
    q = KeySchema(cli_env.key_prefix).for_context(context_id)
    assert redis_client.zscore(q.due, context_id) is not None
    stored = json.loads(redis_client.hget(q.context(context_id), "messages") or "[]")
    assert [m["content"] for m in stored] == [m["content"] for m in CONVERSATION]

    code, out, _ = run("stats", "--json")
    assert code == 0
    assert json.loads(out)["due"] == 1
    code, out, _ = run("stats")
    assert code == 0 and "due" in out and "oldest deadline lag" in out


def test_stats_names_depths_and_totals_apart(
    run: Run, cli_env: MemqSettings, redis_client: redis.Redis
) -> None:
    from memq.core.metrics import MetricsRecorder
    from worker.tick import TickReport

    recorder = MetricsRecorder.for_settings(cli_env, redis_client)
    for outcome in ("updated", "updated", "retry", "dead"):
        recorder.extraction(outcome)
    recorder.tick(TickReport(claimed=4, requeued=1, dead=1), 1_000)
    for _ in range(3):
        recorder.stale_run()

    code, out, _ = run("doctor", "--json")
    assert {c["name"]: c for c in json.loads(out)["checks"]}["ticker"][
        "status"
    ] == "warn"  # long ago
    recorder.tick(TickReport(), int(time.time() * 1000))
    code, out, _ = run("doctor", "--json")
    assert {c["name"]: c for c in json.loads(out)["checks"]}["ticker"]["status"] == "ok"

    code, out, _ = run("stats")
    assert code == 0
    rows = {
        line[: line.rindex("  ")].strip(): line.split()[-1]
        for line in out.splitlines()[2:]
        if "  " in line.strip()
    }
    assert rows["dead letters now"] == "0"
    assert "dead" not in rows  # one meaning per row: depth now vs. total ever
    assert rows["extractions: updated"] == "2"
    assert rows["extractions: retry scheduled"] == "1"
    assert rows["extractions: dead-lettered"] == "1"
    assert rows["dead-lettered in total (failed runs + expired leases)"] == "2"
    assert rows["stale runs discarded (lost their claim)"] == "3"  # not an extraction
    assert rows["queue: claimed and dispatched"] == "4"
    assert rows["queue: leases expired, back to due"] == "1"
    code, out, _ = run("stats", "--json")
    stats = json.loads(out)
    assert stats["extractions"] == {"dead": 1, "retry": 1, "updated": 2}
    assert stats["shards"] == [
        {
            "shard": 0,
            "due": 0,
            "inflight": 0,
            "dead": 0,
            "batch_pending": 0,
            "batch_out": 0,
            "batch_jobs": 0,
            "oldest_due_lag_ms": 0,
        }
    ]


@pytest.mark.parametrize(
    ("content", "needle"),
    [
        ("{not json", "is not valid JSON (line 1"),
        ('{"messages": 3}', "expected a JSON list of messages"),
        (
            '[{"role": "tool", "content": "x"}, {"role": "user", "content": "hi"}]',
            "nothing to remember: it needs at least one user message and one assistant answer; "
            "missing: an assistant answer (2 message(s) given; tool results",
        ),
    ],
)
def test_enqueue_bad_file(
    run: Run, cli_env: MemqSettings, tmp_path: Path, content: str, needle: str
) -> None:
    path = tmp_path / "bad.json"
    path.write_text(content, encoding="utf-8")
    code, _, err = run("enqueue", str(path), "--thread", "t", "--user", "u")
    assert_one_line_error(code, err, needle)


def test_enqueue_missing_file_and_bad_user(run: Run, cli_env: MemqSettings, tmp_path: Path) -> None:
    code, _, err = run("enqueue", str(tmp_path / "nope.json"), "--thread", "t", "--user", "u")
    assert_one_line_error(code, err, "no such file", "nope.json")
    path = write_json(tmp_path / "chat.json", CONVERSATION)
    code, _, err = run("enqueue", path, "--thread", "t", "--user", "bad\tuser")
    assert_one_line_error(code, err, "user_id")


def make_dead(settings: MemqSettings, client: redis.Redis, thread: str) -> str:
    with MemoryProducer(settings, client) as producer:
        result = producer.enqueue(thread, "carol", None, CONVERSATION, flush=True)
    assert result is not None
    queue = StartingQueue(settings, client)
    (claim,) = queue.claim().claims
    queue.fail(claim.context_id, claim.token, "PermanentLLMError: invalid api key", None)
    return claim.context_id


def test_dead_list_retry_purge(run: Run, cli_env: MemqSettings, redis_client: redis.Redis) -> None:
    code, out, _ = run("dead", "list")
    assert (code, out.strip()) == (0, "no dead letters")
    first = make_dead(cli_env, redis_client, "t-dead-1")
    second = make_dead(cli_env, redis_client, "t-dead-2")
    code, out, _ = run("dead", "list")
    assert code == 0 and first in out and "invalid api key" in out
    code, out, _ = run("dead", "list", "--json")
    assert [e["context_id"] for e in json.loads(out)] == [first, second]

    code, out, _ = run("dead", "retry", first)
    assert code == 0 and "1 dead context(s) retried" in out
    queue = StartingQueue(cli_env, redis_client)
    assert queue.stats()["dead"] == 1 and queue.stats()["due"] == 1

    code, out, _ = run("dead", "purge", "--all")
    assert code == 0 and "1 dead context(s) purged" in out
    assert queue.load(second) == {}


def test_dead_retry_needs_ids_or_all(run: Run, cli_env: MemqSettings) -> None:
    code, _, err = run("dead", "retry")
    assert_one_line_error(code, err, "give context ids or --all")
    code, out, _ = run("dead", "purge", "no:such:")
    assert code == 1 and "1 of the given ids were not dead letters" in out


# --- doctor and config
def test_doctor_passes_on_a_well_configured_stack(
    run: Run, monkeypatch: pytest.MonkeyPatch, tmp_path: Path, openai_server: ScriptedOpenAI
) -> None:
    with RedisServer(tmp_path / "redis", appendonly=True) as server:
        monkeypatch.setenv("MEMQ_REDIS_URL", server.url)
        monkeypatch.setenv("MEMQ_LLM_BASE_URL", openai_server.base_url)
        code, out, _ = run("doctor")
    assert code == 0, out
    for line in (
        "OK    redis: Redis ",
        "OK    persistence: AOF",
        "OK    maxmemory-policy",
        "OK    broker",
        f"OK    llm: {openai_server.base_url} answered HTTP 200",
        "OK    tiktoken",
    ):
        assert line in out
    assert "All checks passed." in out


def test_doctor_says_what_to_fix(
    run: Run, cli_env: MemqSettings, monkeypatch: pytest.MonkeyPatch
) -> None:
    # The shared test Redis runs without AOF or snapshots, and no LLM listens on this port.
    monkeypatch.setenv("MEMQ_LLM_BASE_URL", f"http://127.0.0.1:{free_port()}/v1")
    monkeypatch.setenv("MEMQ_LLM_PROVIDER", "openai")
    code, out, _ = run("doctor")
    assert code == 1
    assert "FAIL  persistence: neither AOF nor RDB" in out
    assert "fix: CONFIG SET appendonly yes" in out
    assert "FAIL  llm: cannot reach" in out
    assert "2 problem(s) found." in out


def test_doctor_reports_offline_extractor(run: Run, cli_env: MemqSettings) -> None:
    _, out, _ = run("doctor", "--json")
    checks = {c["name"]: c for c in json.loads(out)["checks"]}
    assert checks["ticker"]["status"] == "warn"  # no beat has ticked on this prefix
    assert "no tick recorded yet" in checks["ticker"]["detail"]
    assert "offline rules extractor is in use" in checks["llm"]["detail"]
    assert checks["redis"]["status"] == "ok"


def test_doctor_and_config_show_file_storage_absolute_and_warn_it_is_not_shared(
    run: Run, cli_env: MemqSettings, monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MEMQ_STORAGE", "file")
    monkeypatch.setenv("MEMQ_STORAGE_DIR", "relative/memory")
    _, out, _ = run("doctor", "--json")
    storage = {c["name"]: c for c in json.loads(out)["checks"]}["storage"]
    assert storage["status"] == "warn"
    assert str(tmp_path / "relative" / "memory") in storage["detail"]
    assert "other hosts" in storage["detail"]
    code, out, _ = run("config")
    assert code == 0 and (tmp_path / "relative" / "memory").as_posix() in out
    monkeypatch.delenv("MEMQ_STORAGE")
    _, out, _ = run("doctor", "--json")
    assert {c["name"]: c for c in json.loads(out)["checks"]}["storage"]["status"] == "ok"


def test_config_masks_secrets(run: Run, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("MEMQ_REDIS_URL", "redis://admin:hunter2@127.0.0.1:6390/0")
    monkeypatch.setenv("OPENAI_API_KEY", "sk-secret-key")
    code, out, _ = run("config")
    assert code == 0
    assert "redis://admin:***@127.0.0.1:6390/0" in out
    assert "hunter2" not in out and "sk-secret-key" not in out


# --- memory: show, inject, facts, export/import, forget
def test_facts_add_rejects_an_unknown_category_listing_the_known_ones(
    run: Run, cli_env: MemqSettings
) -> None:
    code, _, err = run("facts", "add", "dora", "Is vegan", "--category", "corection")
    assert_one_line_error(
        code,
        err,
        "unknown category 'corection' (known: preference, knowledge, context, behavior, goal, "
        "correction); did you mean 'correction'?",
    )
    code, _, err = run("show", "dora")
    assert_one_line_error(code, err, "unknown user 'dora'")  # nothing was written


def test_one_fact_is_singular_and_show_help_says_what_show_does(
    run: Run, cli_env: MemqSettings, capsys: pytest.CaptureFixture[str]
) -> None:
    assert run("facts", "add", "dora", "Is vegan", "--category", "correction")[0] == 0
    assert run("facts", "add", "dora", "Flies gliders", "--agent", "Pilot")[0] == 0
    code, out, _ = run("show", "dora")
    assert code == 0
    assert "agent (global) · 1 fact ·" in out and "agent pilot · 1 fact ·" in out
    with pytest.raises(SystemExit):
        main(["show", "--help"])
    help_text = " ".join(capsys.readouterr().out.split())
    assert "every agent the user has a memory for" in help_text
    assert "only this agent's memory (default: every agent of the user)" in help_text


DEERFLOW_MEMORY = {
    "version": "1.0",
    "lastUpdated": "2026-01-05T10:00:00Z",
    "user": {"workContext": {"summary": "Embedded Rust developer.", "updatedAt": ""}},
    "history": {},
    "facts": [
        {
            "id": "fact_rust",
            "content": "Writes Rust for microcontrollers",
            "category": "knowledge",
            "confidence": 0.9,
            "createdAt": "2026-01-05T10:00:00Z",
            "source": "thread-9",
        },
        {
            "id": "fact_tabs",
            "content": "Prefers answers as tables",
            "category": "preference",
            "confidence": 0.8,
            "createdAt": "2026-01-05T10:00:00Z",
            "source": "thread-9",
        },
    ],
}


def test_memory_round_trip(run: Run, cli_env: MemqSettings, tmp_path: Path) -> None:
    path = write_json(tmp_path / "deerflow.json", DEERFLOW_MEMORY)
    code, out, _ = run("import", "carol", path, "--agent", "Coder")
    assert (code, out.strip()) == (0, "imported 2 facts into user carol, agent coder")

    code, out, _ = run("show", "carol")
    assert code == 0
    assert "agent coder" in out and "work context: Embedded Rust developer." in out
    assert out.index("Writes Rust for microcontrollers") < out.index("Prefers answers as tables")
    code, out, _ = run("show", "carol", "--agent", "coder", "--json")
    (memory,) = json.loads(out)["memories"]
    assert memory["agent_name"] == "coder"
    assert {f["id"] for f in memory["memory"]["facts"]} == {"fact_rust", "fact_tabs"}

    code, out, _ = run("inject", "carol", "--agent", "coder")
    assert code == 0
    assert out.startswith("<user_memory>") and out.rstrip().endswith("</user_memory>")
    assert "Writes Rust for microcontrollers" in out

    code, out, _ = run("facts", "search", "carol", "TABLES", "--agent", "coder")
    assert code == 0 and "fact_tabs" in out and "fact_rust" not in out
    code, out, _ = run(
        "facts",
        "add",
        "carol",
        "Lives in Lisbon",
        "--agent",
        "coder",
        "--category",
        "context",
        "--confidence",
        "0.95",
    )
    assert code == 0 and out.startswith("added fact_")
    code, out, _ = run(
        "facts",
        "edit",
        "carol",
        "fact_tabs",
        "--agent",
        "coder",
        "--content",
        "Prefers bullet lists",
    )
    assert code == 0 and "Prefers bullet lists" in out
    code, out, _ = run("facts", "delete", "carol", "fact_rust", "--agent", "coder")
    assert code == 0 and "deleted fact_rust" in out

    exported = tmp_path / "export.json"
    code, out, _ = run("export", "carol", "--agent", "coder", "-o", str(exported))
    assert code == 0 and "exported 2 facts" in out
    contents = {f["content"] for f in json.loads(exported.read_text(encoding="utf-8"))["facts"]}
    assert contents == {"Prefers bullet lists", "Lives in Lisbon"}

    code, out, _ = run("forget", "carol")
    assert code == 0 and "forgot user carol: 1 memory document (with its history)" in out
    code, _, err = run("show", "carol")
    assert_one_line_error(code, err, "unknown user 'carol'")


@pytest.mark.parametrize(
    "argv",
    [
        ("show", "nobody"),
        ("inject", "nobody"),
        ("export", "nobody"),
        ("facts", "search", "nobody", "x"),
        ("facts", "delete", "nobody", "fact_1"),
    ],
)
def test_unknown_user_is_a_clear_error(
    run: Run, cli_env: MemqSettings, argv: tuple[str, ...]
) -> None:
    code, out, err = run(*argv)
    assert_one_line_error(code, err, "unknown user 'nobody'")
    assert out == ""


def test_forget_of_an_unknown_user_says_nothing_was_held(run: Run, cli_env: MemqSettings) -> None:
    code, out, _ = run("forget", "nobody")  # idempotent: a repeated forget is not an error
    assert code == 0 and "nothing held about user nobody" in out


def test_memory_command_errors(run: Run, cli_env: MemqSettings, tmp_path: Path) -> None:
    path = write_json(tmp_path / "memory.json", DEERFLOW_MEMORY)
    assert run("import", "dave", path)[0] == 0
    code, _, err = run("show", "dave", "--agent", "other")
    assert_one_line_error(code, err, "user 'dave' has no memory for agent other (it has: (global))")
    code, _, err = run("facts", "delete", "dave", "fact_nope")
    assert_one_line_error(code, err, "Memory fact 'fact_nope' not found.")
    code, _, err = run("facts", "add", "dave", "x", "--confidence", "3")
    assert_one_line_error(code, err, "confidence must be between 0 and 1")
    bad = tmp_path / "bad.json"
    bad.write_text('{"facts": [', encoding="utf-8")
    code, _, err = run("import", "dave", str(bad))
    assert_one_line_error(code, err, "bad.json is not valid JSON")
    code, _, err = run("import", "dave", write_json(tmp_path / "list.json", [1, 2]))
    assert_one_line_error(code, err, "must be a JSON object")
    code, _, err = run("import", "dave", write_json(tmp_path / "other.json", {"name": "x"}))
    assert_one_line_error(code, err, "not a memory document")
    # The failed imports left dave's memory as it was.
    code, out, _ = run("show", "dave")
    assert code == 0 and "fact_rust" in out


# --- up (the supervised stack)
@pytest.mark.e2e
def test_up_runs_the_stack_until_sigterm(tmp_path: Path) -> None:
    import signal
    import urllib.request

    port, exporter_port, serve_port = free_port(), free_port(), free_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("MEMQ_")}
    env.update(
        MEMQ_DATA_DIR=str(tmp_path / "data"),
        MEMQ_FLOWER_PORT=str(port),
        MEMQ_EXPORTER_PORT=str(exporter_port),
        MEMQ_SERVE_PORT=str(serve_port),
        MEMQ_STORAGE_DIR=str(tmp_path / "memory"),
        PYTHONUNBUFFERED="1",
    )
    log = tmp_path / "up.log"
    with log.open("wb") as sink:
        up = subprocess.Popen(
            [str(Path(sys.executable).with_name("memq")), "up"],
            env=env,
            cwd=tmp_path,
            stdout=sink,
            stderr=subprocess.STDOUT,
        )
    try:
        line = wait_for(
            lambda: next(
                (x for x in log.read_text().splitlines() if "password (generated" in x), None
            ),
            what="memq up prints the Flower password",
        )
        password = line.rsplit(" ", 1)[1]

        def flower_answers() -> bool:
            request = urllib.request.Request(f"http://127.0.0.1:{port}/api/workers")
            token = base64.b64encode(f"memq:{password}".encode()).decode()
            request.add_header("Authorization", f"Basic {token}")
            try:
                with urllib.request.urlopen(request, timeout=2) as response:
                    return response.status == 200
            except OSError:
                return False

        wait_for(flower_answers, interval=0.2, what="Flower with the printed password")

        def metrics_served() -> bool:
            url = f"http://127.0.0.1:{exporter_port}/metrics"
            try:
                with urllib.request.urlopen(url, timeout=2) as response:
                    return b"memq_up 1" in response.read()
            except OSError:
                return False

        wait_for(metrics_served, interval=0.2, what="the supervised exporter")

        def serve_ready() -> bool:
            # /readyz: the supervised `memq serve` reaches the private Redis and sees beat tick.
            try:
                url = f"http://127.0.0.1:{serve_port}/readyz"
                with urllib.request.urlopen(url, timeout=2) as response:
                    return response.status == 200
            except OSError:
                return False

        wait_for(serve_ready, interval=0.2, what="the supervised memq serve")
        assert any((tmp_path / "data" / "redis").glob("appendonly*"))  # private Redis, AOF on
        up.send_signal(signal.SIGTERM)
        assert up.wait(timeout=DEADLINE_SECONDS) == 0
    finally:
        if up.poll() is None:
            up.kill()
            up.wait()
    assert "memq up: Redis redis://:***@127.0.0.1:" in log.read_text()  # password-protected
    assert not flower_answers()  # stopped with the supervisor


@pytest.mark.e2e
def test_stack_stops_everything_when_a_child_keeps_dying(settings: MemqSettings) -> None:
    import signal

    from memq.local.options import StackOptions
    from memq.local.stack import Stack
    from memq.local.supervision import RestartPolicy

    # No crash allowed: the first death is already "too many" (restarts: test_stack_supervision).
    never = RestartPolicy(max_crashes=0)
    stack = Stack(settings, StackOptions(flower=False, loglevel="WARNING", restart=never))
    stack.start()
    worker, beat = sorted(stack.children, key=lambda c: c.name != "worker")
    assert worker.process is not None and beat.process is not None
    os.killpg(worker.process.pid, signal.SIGKILL)
    assert stack.supervise(poll_seconds=0.05) == 1
    assert beat.process.poll() is not None  # the survivor was stopped too


# --- stored text never drives the operator's terminal
HIDE_LINES = "\x1b[1A\x1b[2K"  # cursor up one line, erase it


def test_stored_control_characters_are_shown_escaped_and_json_stays_exact(
    run: Run, cli_env: MemqSettings, redis_client: redis.Redis
) -> None:
    from storage import get_storage
    from storage.document import Fact, MemoryDocument
    from storage.sections import Section

    evil = f"Likes tea{HIDE_LINES}\rall good\u202eevil\u2028\x07"
    document = MemoryDocument(
        facts=[Fact(id="f_evil", content=evil, category=f"pref{HIDE_LINES}", confidence=0.9)]
    )
    document.user.work_context = Section(summary=f"Engineer{HIDE_LINES}\nuser root · agent x")
    get_storage(cli_env).save("carol", None, document)
    raw = ("\x1b", "\r", "\u202e", "\u2028", "\x07")
    for argv in (("show", "carol"), ("facts", "search", "carol", "tea"), ("inject", "carol")):
        code, out, _ = run(*argv)
        assert code == 0, argv
        assert not any(char in out for char in raw), (argv, out)
        assert "\\x1b[1A\\x1b[2K" in out, argv
    code, out, _ = run("show", "carol")
    assert "Engineer\\x1b[1A\\x1b[2K\\nuser root" in out  # a stored line break forges no line
    code, out, _ = run("show", "carol", "--json")
    (memory,) = json.loads(out)["memories"]
    assert memory["memory"]["facts"][0]["content"] == evil  # JSON output stays exact

    with MemoryProducer(cli_env, redis_client) as producer:
        assert producer.enqueue("t-esc", "carol", None, CONVERSATION, flush=True) is not None
    queue = StartingQueue(cli_env, redis_client)
    (claim,) = queue.claim().claims
    queue.fail(claim.context_id, claim.token, f"LLMError{HIDE_LINES}", None)
    code, out, _ = run("dead", "list")
    assert code == 0 and "\x1b" not in out and "LLMError\\x1b[1A\\x1b[2K" in out
    code, out, _ = run("dead", "list", "--json")
    assert json.loads(out)[0]["last_error"] == f"LLMError{HIDE_LINES}"

    code, out, _ = run("facts", "delete", "carol", "f_evil")
    assert code == 0 and "\x1b" not in out and "\\x1b[1A" in out


def test_why_shows_sources_escaped_and_an_unknown_fact_in_one_line(
    run: Run, cli_env: MemqSettings
) -> None:
    from storage import get_storage
    from storage.document import Fact, MemoryDocument
    from storage.sources import Source

    evil = f"Lives in Berlin{HIDE_LINES}\u202e"
    source = Source(thread_id=f"auth0|abc{HIDE_LINES}", attribution="message", roles=("user",))
    fact = Fact(id="f_why", content=evil, sources=[source], confirmations=2)
    get_storage(cli_env).save("dana", None, MemoryDocument(facts=[fact]))
    code, out, _ = run("why", "dana", "f_why")
    assert code == 0 and "\x1b" not in out and "\u202e" not in out
    assert "confirmations: 2" in out and "message" in out and "auth0|abc\\x1b[1A" in out
    code, out, _ = run("why", "dana", "f_why", "--json")
    assert json.loads(out)["fact"]["content"] == evil
    code, _, err = run("why", "dana", "nope")
    assert_one_line_error(code, err, "nope")
