"""P6: prompt tokens per extraction along one thread, turns 1…50: memq (the pipeline's message
selection, watermark carried from turn to turn, default token budget) against memq's own prompt
builder fed the whole thread every time (no watermark, no budget): what a whole-thread re-send
costs, the way DeerFlow's updater sends a thread. It is not DeerFlow's own prompt. Both are
counted with tiktoken over the system and user messages."""

from __future__ import annotations

from datetime import UTC, datetime

from bench.common import BenchEnv, Result
from bench.guard import Ratio
from bench.p7_injection import memory_with_facts
from memq.core.models import Message
from prompts.tokens import make_token_counter
from prompts.update_prompt import STATIC_SYSTEM_PROMPT, build_update_prompt
from worker.pipeline import prompt_for
from worker.watermark import split_at_watermark

TURNS = 50
SHOWN = (1, 5, 10, 25, 50)


def thread(turns: int) -> list[Message]:
    """A synthetic thread: ~80-token questions, ~220-token answers, ids as frameworks give."""
    messages: list[Message] = []
    for turn in range(1, turns + 1):
        ask = f"Turn {turn}: how should I structure module m{turn} of the billing service in Go? "
        answer = f"For m{turn}, split handlers from storage, add table tests, pin Go 1.22. "
        messages.append(Message("user", ask * 4, f"msg-{turn}-u"))
        messages.append(Message("assistant", answer * 12, f"msg-{turn}-a"))
    return messages


def run(env: BenchEnv) -> Result:
    settings = env.settings()
    # The re-send baseline is uncapped: the whole thread however long it grows.
    resend_settings = env.settings(conversation_max_tokens=10_000_000, message_max_chars=10**7)
    count = make_token_counter(True)
    memory = memory_with_facts(20)
    now = datetime(2025, 6, 1, tzinfo=UTC)
    full = thread(TURNS)
    watermark: str | None = None
    memq_tokens: dict[int, int] = {}
    resend_tokens: dict[int, int] = {}
    sent_counts: dict[int, int] = {}
    for turn in range(1, TURNS + 1):
        messages = full[: 2 * turn]
        # Exactly what the pipeline sends: the new part after the watermark, plus context.
        selection = split_at_watermark(messages, watermark, settings.context_messages)
        watermark = selection.watermark or watermark  # None means: leave it
        prompt = prompt_for(selection, memory, settings, now=now, count_tokens=count)
        resend = build_update_prompt(
            memory, messages, settings=resend_settings, now=now, count_tokens=count
        )
        if prompt is None or resend is None:
            raise RuntimeError(f"turn {turn}: no prompt")
        memq_tokens[turn] = count(prompt.system) + count(prompt.user)
        resend_tokens[turn] = count(resend.system) + count(resend.user)
        sent_counts[turn] = len(prompt.conversation) + prompt.earlier_shown
    flatness = memq_tokens[TURNS] / memq_tokens[10]
    # Both sides start with the same static part (the instructions, > 1,024 tokens so a provider
    # caches it: byte-identical on every call, billed at the cached price). memq does not choose
    # it, so the goal is on what memq does choose: the conversation and the memory it sends.
    static = count(STATIC_SYSTEM_PROMPT) if settings.llm_prompt_layout == "cache_friendly" else 0
    share = (memq_tokens[TURNS] - static) / (resend_tokens[TURNS] - static)
    whole = memq_tokens[TURNS] / resend_tokens[TURNS]
    return Result(
        key="P6",
        title="cost: prompt tokens at turn 50 of a thread (the part memq chooses)",
        measured=f"memq {memq_tokens[TURNS] - static:,} tokens at turn 50 besides the static "
        f"part ({sent_counts[TURNS]} messages sent); turn50/turn10 {flatness:.2f}",
        baseline=f"memq's builder without the watermark (whole-thread re-send) "
        f"{resend_tokens[TURNS] - static:,} tokens; ratio {share:.0%} (with the cached static "
        f"part of {static:,} tokens in both: {whole:.0%})",
        goal="turn 50 <= 15 % of re-send without the static part, flat (turn50/turn10 <= 1.25)",
        met=share <= 0.15 and flatness <= 1.25,
        ratios={
            "turn 50 vs re-send, chosen part": Ratio(share, "lower"),
            "turn 50 vs re-send, whole prompt": Ratio(whole, "lower"),
        },
        details=[
            "turn (whole prompts): "
            + ", ".join(f"{t}: {memq_tokens[t]:,} vs {resend_tokens[t]:,}" for t in SHOWN),
            f"memory in the prompt: 20 facts; context_messages={settings.context_messages}",
            f"the static part ({static:,} tokens, byte-identical on every call, cached by the "
            f"provider) is in both; with it memq is {whole:.0%} of the re-send",
            "baseline: the same build_update_prompt given the whole thread, uncapped (not "
            "DeerFlow's prompt text; the watermark and the budget are what differ)",
        ],
    )
