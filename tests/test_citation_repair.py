"""Citation repair: a fact a small model attributed to the assistant's reply is re-attributed to
the user's message that says every word it shares with that reply — and only then (the grounding
rule still keeps a claim only the assistant made out of memory)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from memq.core.models import Message
from memq.core.settings import MemqSettings
from memq.memory.apply import apply_update
from memq.memory.update import NewFact, UpdateAnswer
from prompts.conversation import message_excerpt, message_text
from storage.document import Fact, MemoryDocument
from storage.provenance import RunInfo, RunMessage, repaired_citation
from worker.watermark import message_identity

NOW = datetime(2026, 7, 15, 12, 0, tzinfo=UTC)
SETTINGS = MemqSettings(llm_provider="rules")

# The probe's long session (bench/probe_model.py), the GitLab turn in its middle.
LONG = (
    ("user", "How do I run tests in parallel?"),
    ("assistant", "pytest-xdist: pytest -n auto."),
    ("user", "By the way, our CI runs on GitLab, not GitHub, so give me GitLab CI syntax."),
    ("assistant", "Understood: .gitlab-ci.yml with stages and jobs."),
    ("user", "How do I cache pip downloads there?"),
    ("assistant", "cache: paths: [.cache/pip] with PIP_CACHE_DIR."),
)
NEOVIM = (
    ("user", "I'm new to Rust, I come from Python. Which editor should I use?"),
    ("assistant", "Since you are a Neovim power user, install rust-analyzer for Neovim."),
    ("user", "ok"),
)


def run_of(*said: tuple[str, str], confirmed: bool = False, labels: Any = None) -> RunInfo:
    """A run over ``said`` (role, text), labelled m1… (or ``labels``), each message said a minute
    after the one before, keeping its text as the pipeline's run does."""
    names = labels or [f"m{i}" for i in range(1, len(said) + 1)]
    messages = []
    for i, ((role, text), label) in enumerate(zip(said, names, strict=True)):
        message = Message(role, text)  # type: ignore[arg-type]
        messages.append(
            RunMessage(
                label,
                message_identity(message),
                message.role,
                message_excerpt(message),
                NOW - timedelta(minutes=len(said) - i),
                message_text(message),
            )
        )
    return RunInfo("t1", "r1", NOW, tuple(messages), "qwen", "update-test", confirmed)


def learn(run: RunInfo, *facts: NewFact, settings: MemqSettings = SETTINGS) -> Any:
    answer = UpdateAnswer(new_facts=facts)
    return apply_update(
        MemoryDocument(), answer, settings=settings, now=NOW, thread_id="t1", run=run
    )


def new(content: str, *cites: str) -> NewFact:
    return NewFact(content=content, confidence=0.9, cites=cites)


def test_the_gitlab_fact_citing_the_reply_is_attributed_to_the_users_message() -> None:
    run = run_of(*LONG)
    result = learn(run, new("I use GitLab CI for my projects", "m4"))
    (fact,) = result.document.facts
    (source,) = fact.sources
    user = run.messages[2]
    # The source is the user's message, as if the model had cited it: its digest, its excerpt
    # (what `memq why` shows) and its time (when the user said it, not the reply a minute later).
    assert (source.attribution, source.roles, source.messages) == (
        "message",
        ("user",),
        (user.digest,),
    )
    assert source.excerpts == (user.excerpt,)
    assert fact.said_at == source.said_at == user.said_at
    assert (result.refused, result.repaired) == (0, 1)
    (change,) = result.changes
    assert change.reason.endswith("its citation of the assistant moved to the user's message")


def test_the_assistant_only_claim_stays_refused() -> None:
    run = run_of(*NEOVIM)
    result = learn(
        run,
        new("Is a Neovim power user", "m2"),
        new("Uses rust-analyzer with Neovim", "m2"),  # "rust" the user said; "neovim" never
        new("Since you are a Neovim power user", "m2", "m2"),
    )
    assert result.document.facts == []
    assert (result.refused, result.repaired) == (3, 0)


@pytest.mark.parametrize(
    ("content", "why"),
    [
        ("Prefers YAML pipelines", "shares no word with the cited reply"),
        ("The user and their team use it", "shares only stop words and 'user'"),
        ("Caches jobs with stages", "the words it shares with the reply no user message says"),
        ("GitLab CI caches pip", "'gitlab' and 'ci' in m3, 'pip' only in m5: no one message"),
    ],
)
def test_a_fact_the_user_did_not_say_stays_refused(content: str, why: str) -> None:
    run = run_of(*LONG)
    cites = ("m4", "m6") if "pip" in content else ("m4",)
    result = learn(run, new(content, *cites))
    assert result.document.facts == [], why
    assert (result.refused, result.repaired) == (1, 0)


def test_the_nearest_user_message_before_the_reply_is_tried_first() -> None:
    run = run_of(
        ("user", "We moved our CI to GitLab."),
        ("user", "Our GitLab CI is slow today."),
        ("assistant", "GitLab CI can cache between jobs."),
        ("user", "Yes, GitLab CI."),
    )
    assert repaired_citation(run, "Uses GitLab CI", ["m3"]) == "m2"
    # Nothing before it holds every shared word: the nearest after it does.
    only_after = run_of(
        ("user", "Hello."),
        ("assistant", "GitLab CI can cache between jobs."),
        ("user", "Hm."),
        ("user", "Yes, our CI is GitLab."),
    )
    assert repaired_citation(only_after, "Uses GitLab CI", ["m2"]) == "m4"


def test_a_citation_already_grounded_or_not_the_assistants_is_left_alone() -> None:
    run = run_of(*LONG)
    assert repaired_citation(run, "Uses GitLab CI", ["m3"]) is None  # the user's own message
    assert repaired_citation(run, "Uses GitLab CI", ["m3", "m4"]) is None  # one of them the user's
    assert repaired_citation(run, "Uses GitLab CI", []) is None  # run-level: nothing to move
    assert (
        repaired_citation(run, "Uses GitLab CI", ["m4", "m99"]) is None
    )  # a wrong label: run-level
    assert repaired_citation(run, "Uses GitLab CI", ["M4"]) is None  # labels are case-sensitive
    # Duplicate and several assistant citations: their words together.
    assert repaired_citation(run, "Uses GitLab CI", ["m4", "m4"]) == "m3"
    assert repaired_citation(run, "Uses GitLab CI", ["m6", "m4"]) == "m3"


def test_confirmed_runs_and_grounding_off_need_no_repair() -> None:
    confirmed = learn(run_of(*NEOVIM, confirmed=True), new("Is a Neovim power user", "m2"))
    assert [f.content for f in confirmed.document.facts] == ["Is a Neovim power user"]
    assert confirmed.repaired == 0
    off = SETTINGS.model_copy(update={"grounding_requires_user": False})
    lenient = learn(run_of(*LONG), new("Uses GitLab CI", "m4"), settings=off)
    assert lenient.repaired == 0 and lenient.document.facts[0].sources[0].roles == ("assistant",)


def test_messages_without_their_text_repair_nothing() -> None:
    """A parked run whose context no longer holds the messages: refused as before."""
    run = run_of(*LONG)
    bare = RunInfo(
        run.thread_id,
        run.run_id,
        run.at,
        tuple(RunMessage(m.label, m.digest, m.role) for m in run.messages),
    )
    assert learn(bare, new("Uses GitLab CI", "m4")).refused == 1


def test_odd_labels_and_text_are_matched_as_words() -> None:
    said = (
        ("user", "Our runner is ci.example.com/a%2Fb on ＧｉｔＬａｂ 16 — ask ops@example.com."),
        ("assistant", "Noted: GitLab 16 at ci.example.com/a%2Fb."),
    )
    run = run_of(*said, labels=["m1/x", "m.2%"])
    # Full-width letters fold to ASCII, "/", "%" and "." split words.
    assert repaired_citation(run, "Runs GitLab 16 at ci.example.com", ["m.2%"]) == "m1/x"
    assert (
        repaired_citation(run, "Writes to ops@example.com", ["m.2%"]) == "m1/x"
    )  # "example", "com"
    assert repaired_citation(run, "Runs GitLab 17", ["m.2%"]) == "m1/x"  # shares "gitlab" only
    assert repaired_citation(run, "Runs GitLab 16", ["m1/x "]) is None  # not this run's label
    chinese = run_of(
        ("user", "我们的持续集成跑在 GitLab 上。"), ("assistant", "好的，GitLab 持续集成。")
    )
    assert repaired_citation(chinese, "团队的持续集成在 GitLab 上", ["m2"]) == "m1"
    assert repaired_citation(chinese, "团队用 GitHub", ["m2"]) is None


def test_a_repaired_fact_already_known_is_confirmed_by_the_users_message() -> None:
    run = run_of(*LONG)
    known = Fact(id="f1", content="Uses GitLab CI", created_at=NOW - timedelta(days=3))
    answer = UpdateAnswer(new_facts=(new("uses gitlab  CI", "m4"),))
    result = apply_update(
        MemoryDocument(facts=[known]), answer, settings=SETTINGS, now=NOW, thread_id="t1", run=run
    )
    (fact,) = result.document.facts
    assert fact.confirmations == 1 and fact.sources[-1].roles == ("user",)
    assert result.repaired == 1
