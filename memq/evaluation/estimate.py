"""What a run will spend, worked out before anything is spent.

Extraction: one run per (subject, session) that has a dialogue — the eval's debounce makes the
flush at each session's end the one hand-off that triggers a run — split into as many calls as the
worker's own chunk budget cuts the session into. Prompt tokens are those of the real update prompt
rendered over the chunk, plus the memory it shows, which grows by what earlier calls of the same
user wrote (estimated as a share of the user's own words, capped by the fact cap). Answer and judge
calls are one each per question; the recalled block is bounded by the injection budget.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import UTC, datetime

from memq.core.models import Message
from memq.core.settings import MemqSettings
from memq.evaluation.dataset import EvalSet, hand_off_points, messages_for
from memq.evaluation.prompts import answer_prompt, judge_prompt
from memq.evaluation.scoring import Prices, Usage, cost
from producer.messages import filter_messages_for_memory, has_minimum_dialogue
from prompts.tokens import TokenCounter
from prompts.update_prompt import build_update_prompt
from storage.document import MemoryDocument
from worker.pipeline import chunk_budget

# An extraction answer restates about half of what the user said, plus its JSON frame; each
# stored fact then shows in later prompts with its id, category and dates.
COMPLETION_SHARE = 0.5
COMPLETION_FRAME_TOKENS = 40
MEMORY_TOKENS_PER_FACT_CAP = 40  # with max_facts: the most memory a prompt can show
ANSWER_COMPLETION_TOKENS = 20
JUDGE_COMPLETION_TOKENS = 30


@dataclass(frozen=True, slots=True)
class Estimate:
    conversations: int
    sessions: int
    turns: int
    hand_offs: int
    questions: int
    extraction: Usage
    answer: Usage
    judge: Usage
    extraction_cost: float | None
    answer_cost: float | None
    judge_cost: float | None

    @property
    def total_cost(self) -> float | None:
        parts = (self.extraction_cost, self.answer_cost, self.judge_cost)
        return None if any(p is None for p in parts) else sum(p or 0.0 for p in parts)


def extraction_calls(
    messages: list[Message], settings: MemqSettings, count: TokenCounter
) -> list[list[Message]]:
    """The chunks one session's extraction sends, oldest first (the worker's own budget rule)."""
    budget = chunk_budget(settings, count)
    chunks: list[list[Message]] = []
    rest = messages
    while rest:
        taken = max(1, budget.oldest_fitting(rest))
        chunks.append(rest[:taken])
        rest = rest[taken:]
    return chunks


def estimate(
    evalset: EvalSet,
    settings: MemqSettings,
    count: TokenCounter,
    *,
    extraction_prices: Prices | None,
    answer_prices: Prices | None,
    judge_prices: Prices | None,
    skip_conversations: frozenset[str] = frozenset(),
    skip_sessions: frozenset[tuple[str, str, str]] = frozenset(),
    skip_questions: frozenset[str] = frozenset(),
) -> Estimate:
    """``skip_*``: what a checkpoint says is already done (a resumed run pays only the rest)."""
    now = datetime.now(UTC)
    memory = MemoryDocument()
    memory_cap = settings.max_facts * MEMORY_TOKENS_PER_FACT_CAP
    extraction = Usage()
    sessions = turns = hand_offs = 0
    end_memory: dict[str, int] = {}
    for conversation in evalset.conversations:
        sessions += len(conversation.sessions)
        turns += conversation.turn_count
        if conversation.id in skip_conversations:
            continue
        shown_total = 0
        for subject in conversation.subjects:
            shown = 0
            for session in conversation.sessions:
                raw = messages_for(conversation, session, subject)
                filtered = filter_messages_for_memory(raw)
                done = (conversation.id, subject, session.id) in skip_sessions
                if not done:
                    hand_offs += len(hand_off_points(raw))
                if not has_minimum_dialogue(filtered):
                    continue
                for chunk in extraction_calls(filtered, settings, count):
                    prompt = build_update_prompt(
                        memory, chunk, settings=settings, now=now, count_tokens=count
                    )
                    if prompt is None:
                        continue
                    own = sum(count(m.content) for m in chunk if m.role == "user")
                    completion = COMPLETION_FRAME_TOKENS + int(own * COMPLETION_SHARE)
                    if not done:
                        prompt_tokens = count(prompt.system) + count(prompt.user) + shown
                        extraction += Usage(1, prompt_tokens, 0, completion)
                    shown = min(memory_cap, shown + completion)
            shown_total += min(shown, settings.injected_memory_max_tokens)
        end_memory[conversation.id] = shown_total
    answer = judge = Usage()
    questions = 0
    for question in evalset.questions:
        if question.id in skip_questions:
            continue
        questions += 1
        asked = answer_prompt(question, "", question.date)
        block = end_memory.get(question.conversation_id, 0)
        answer += Usage(
            1, count(asked.system) + count(asked.user) + block, 0, ANSWER_COMPLETION_TOKENS
        )
        graded = judge_prompt(evalset.benchmark, question, "")
        judge_tokens = count(graded.system) + count(graded.user) + ANSWER_COMPLETION_TOKENS
        judge += Usage(1, judge_tokens, 0, JUDGE_COMPLETION_TOKENS)
    return Estimate(
        conversations=len(evalset.conversations),
        sessions=sessions,
        turns=turns,
        hand_offs=hand_offs,
        questions=questions,
        extraction=extraction,
        answer=answer,
        judge=judge,
        extraction_cost=cost(extraction, extraction_prices),
        answer_cost=cost(answer, answer_prices),
        judge_cost=cost(judge, judge_prices),
    )
