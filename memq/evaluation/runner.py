"""The edge of `memq eval`: replay each conversation through the real pipeline, then ask and judge.

Per conversation (``concurrency`` of them at once): for each session, every subject's turns are
handed to :class:`MemoryProducer` as an agent hook would (``after_agent`` after each reply), the
session ends with a flush, and the run waits until the workers have extracted it (the context's
hash is gone: done; it carries ``dead_at_ms``: failed) — the next session of a real user comes
days later, after that extraction. Then each question is answered from
``MemoryInjector.block(user, query=question)`` by the answer model and graded by the judge model.
Every step lands in the checkpoint, so a run killed at any point resumes where it was: a session
already extracted is not handed over again, a session handed over but not yet recorded is handed
over again and costs nothing (the worker's watermark finds nothing new), a question answered or
judged is not asked again.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from memq.core.errors import MemqError
from memq.core.identity import ContextKey
from memq.core.metrics import read_counts
from memq.core.models import Message
from memq.core.settings import MemqSettings
from memq.evaluation.checkpoint import Checkpoint
from memq.evaluation.dataset import (
    Conversation,
    EvalSet,
    Question,
    hand_off_points,
    messages_for,
    thread_id_for,
    user_id_for,
)
from memq.evaluation.prompts import ChatPrompt, answer_prompt, judge_prompt, read_verdict
from memq.evaluation.scoring import FactRecord, Usage
from prompts.tokens import TokenCounter
from worker.watermark import message_identity

if TYPE_CHECKING:
    from memq.core.connection import RedisClient
    from producer.injector import MemoryInjector
    from producer.producer import MemoryProducer
    from storage.base import MemoryStorage
    from worker.queue import QueueClient

_POLL_SECONDS = 0.05
# Fact fields a provenance record may use for the ids of the messages a fact comes from.
_CITATION_FIELDS = ("source_message_ids", "message_ids", "cited_message_ids")


class ExtractionFailed(MemqError, RuntimeError):
    """A session's extraction was dead-lettered or did not finish in time."""


class RunStopped(MemqError):
    """Another part of the run failed or was interrupted: this thread stops at its next step."""


@dataclass(frozen=True, slots=True)
class RunOptions:
    answer_model: str
    judge_model: str
    concurrency: int = 4
    answer_concurrency: int = 4
    extraction_timeout_seconds: float = 600.0
    progress: bool = True


class ChatModel:
    """One OpenAI-compatible chat model (the answer or the judge model): text and token usage."""

    def __init__(self, settings: MemqSettings, model: str) -> None:
        import openai

        key = settings.llm_api_key.get_secret_value() if settings.llm_api_key else None
        self.model = model
        self._client = openai.OpenAI(
            api_key=key or "not-needed",
            base_url=settings.llm_base_url,
            timeout=settings.llm_timeout_seconds,
            max_retries=max(2, settings.llm_max_retries),  # the SDK backs off on 429 and 5xx
        )

    def complete(self, prompt: ChatPrompt) -> tuple[str, Usage]:
        response = self._client.chat.completions.create(
            model=self.model,
            messages=prompt.messages(),  # type: ignore[arg-type]
            temperature=0.0,
        )
        choice = response.choices[0] if response.choices else None
        usage = response.usage
        details = getattr(usage, "prompt_tokens_details", None)
        return (choice.message.content or "") if choice else "", Usage(
            1,
            int(getattr(usage, "prompt_tokens", 0) or 0),
            int(getattr(details, "cached_tokens", 0) or 0),
            int(getattr(usage, "completion_tokens", 0) or 0),
        )

    def close(self) -> None:
        self._client.close()


def turn_digests(turn_ids: Sequence[str]) -> dict[str, str]:
    """Each turn id by the digest memq's sources keep of a message id (sources never hold raw
    ids), so a stored citation can be read back as the data set's turn ids."""
    return {message_identity(Message(role="user", content="", id=turn)): turn for turn in turn_ids}


def cited_ids(
    fact: dict[str, Any], turn_of: Mapping[str, str] | None = None
) -> tuple[str, ...] | None:
    """The turn ids a stored fact cites, where the document records them: memq's message-level
    sources (their message digests read through ``turn_of``), or a plain list of ids. A fact
    whose sources are all run-level cites nothing (None): it says which run, not which turn."""
    for name in _CITATION_FIELDS:
        value = fact.get(name)
        if isinstance(value, list) and value:
            return tuple(v for v in value if isinstance(v, str))
    for name in ("sources", "citations"):
        value = fact.get(name)
        if isinstance(value, list):
            found: list[str] = []
            for item in value:
                if not isinstance(item, dict):
                    continue
                found += [
                    mid
                    for mid in [item.get("message_id"), *(item.get("message_ids") or [])]
                    if isinstance(mid, str)
                ]
                if turn_of is not None and item.get("attribution") == "message":
                    found += [
                        turn_of[digest]
                        for digest in item.get("messages") or []
                        if isinstance(digest, str) and digest in turn_of
                    ]
            if found:
                return tuple(dict.fromkeys(found))
    return None


class Runner:
    def __init__(
        self,
        evalset: EvalSet,
        settings: MemqSettings,
        checkpoint: Checkpoint,
        options: RunOptions,
        *,
        redis: RedisClient,
        storage: MemoryStorage,
        producer: MemoryProducer,
        injector: MemoryInjector,
        queue: QueueClient,
        count_tokens: TokenCounter,
        on_poll: Callable[[], None] = lambda: None,
    ) -> None:
        self.evalset = evalset
        self.settings = settings
        self.checkpoint = checkpoint
        self.options = options
        self._redis = redis
        self._storage = storage
        self._producer = producer
        self._injector = injector
        self._queue = queue
        self._count = count_tokens
        self._on_poll = on_poll  # the own stack's supervision round, while waiting
        self._lock = threading.Lock()
        self._stop = threading.Event()

    # --- the whole run
    def run(self, answer: ChatModel, judge: ChatModel) -> None:
        from tqdm import tqdm

        self.checkpoint.set_metrics_baseline(self.read_metrics())
        # The first recall of a process loads the search index's tokenizers: not a latency of
        # memory, so it is paid here, before anything is measured.
        self._injector.block(
            user_id_for(self.evalset.benchmark, "warm-up", "warm-up"), None, query="warm up"
        )
        todo_sessions = sum(
            1
            for c in self.evalset.conversations
            for s in c.sessions
            for subject in c.subjects
            if not self.checkpoint.session_done(c.id, subject, s.id)
        )
        judged = self.checkpoint.judged_questions()
        todo_questions = sum(1 for q in self.evalset.questions if q.id not in judged)
        disable = not self.options.progress
        sessions_bar = tqdm(
            total=todo_sessions, desc="sessions extracted", unit="session", disable=disable
        )
        questions_bar = tqdm(
            total=todo_questions, desc="questions judged", unit="question", disable=disable
        )
        asking = ThreadPoolExecutor(self.options.answer_concurrency)
        ingesting = ThreadPoolExecutor(self.options.concurrency)

        def one(conversation: Conversation) -> None:
            self.ingest(conversation, lambda: _tick(sessions_bar, self._lock))
            questions = [q for q in self.evalset.questions if q.conversation_id == conversation.id]
            tick = lambda: _tick(questions_bar, self._lock)  # noqa: E731 - one line, used once
            list(asking.map(lambda q: self.ask(q, conversation, answer, judge, tick), questions))

        try:
            for future in [ingesting.submit(one, c) for c in self.evalset.conversations]:
                future.result()
        except BaseException:
            # Ctrl-C or a failure: the other threads stop at their next step, so the pools
            # below are shut within one poll or one model call, not after every conversation.
            self._stop.set()
            raise
        finally:
            ingesting.shutdown(wait=True, cancel_futures=True)
            asking.shutdown(wait=True, cancel_futures=True)
            questions_bar.close()
            sessions_bar.close()

    # --- ingestion
    def ingest(self, conversation: Conversation, tick: Callable[[], None]) -> None:
        if conversation.id in self.checkpoint.conversations_done():
            return
        bench = self.evalset.benchmark
        for session in conversation.sessions:
            self._check_stop()
            waiting: list[tuple[str, str, list[float]]] = []
            for subject in conversation.subjects:
                if self.checkpoint.session_done(conversation.id, subject, session.id):
                    continue
                user = user_id_for(bench, conversation.id, subject)
                thread = thread_id_for(conversation.id, session.id)
                messages = messages_for(conversation, session, subject)
                timings: list[float] = []
                points = hand_off_points(messages)
                for point in points[:-1]:
                    started = time.perf_counter()
                    self._producer.after_agent(thread, user, None, messages[:point])
                    timings.append((time.perf_counter() - started) * 1000)
                started = time.perf_counter()
                sent = self._producer.enqueue(thread, user, None, messages, flush=True)
                timings.append((time.perf_counter() - started) * 1000)
                if sent is None:  # nothing worth extracting (no dialogue for this subject)
                    self.checkpoint.mark_session(
                        conversation.id, subject, session.id, timings, "empty"
                    )
                    tick()
                    continue
                waiting.append((subject, ContextKey.create(thread, user, None).id, timings))
            for subject, context_id, timings in waiting:
                self._wait_extracted(context_id)
                self.checkpoint.mark_session(
                    conversation.id, subject, session.id, timings, "extracted"
                )
                tick()
        facts: list[dict[str, Any]] = []
        turn_of = turn_digests([t.id for s in conversation.sessions for t in s.turns])
        for subject in conversation.subjects:
            document = self._storage.load(user_id_for(bench, conversation.id, subject), None)
            for fact in document.facts:
                dumped = fact.model_dump(mode="json")
                facts.append(
                    {
                        "subject": subject,
                        "content": fact.content,
                        "cited": cited_ids(dumped, turn_of),
                    }
                )
        self.checkpoint.mark_conversation(conversation.id, facts)

    def _wait_extracted(self, context_id: str) -> None:
        deadline = time.monotonic() + self.options.extraction_timeout_seconds
        while True:
            self._check_stop()
            self._on_poll()
            state = self._queue.load(context_id)
            if not state:
                return
            if state.get("dead_at_ms"):
                reason = str(state.get("last_error", "no reason"))[:200]
                raise ExtractionFailed(
                    f"an extraction was dead-lettered ({reason}); "
                    "see `memq dead list` with the eval key prefix"
                )
            if time.monotonic() > deadline:
                limit = self.options.extraction_timeout_seconds
                raise ExtractionFailed(
                    f"an extraction did not finish within {limit:g} s"
                    " (are workers running with the eval key prefix?)"
                )
            time.sleep(_POLL_SECONDS)  # poll interval of a condition with a deadline

    # --- questions
    def recall(self, question: Question, conversation: Conversation) -> tuple[str, list[float]]:
        """The recalled memory for a question: every subject's block, labelled by name where the
        conversation has two people, and how long each recall took."""
        parts: list[str] = []
        timings: list[float] = []
        for subject in conversation.subjects:
            user = user_id_for(self.evalset.benchmark, conversation.id, subject)
            started = time.perf_counter()
            block = self._injector.block(user, None, query=question.question)
            timings.append((time.perf_counter() - started) * 1000)
            if block and conversation.named_speakers:
                parts.append(f"Memory of {subject}:\n{block}")
            elif block:
                parts.append(block)
        return "\n\n".join(parts), timings

    def ask(
        self,
        question: Question,
        conversation: Conversation,
        answer: ChatModel,
        judge: ChatModel,
        tick: Callable[[], None],
    ) -> None:
        self._check_stop()
        record = self.checkpoint.question(question.id)
        if "correct" in record:
            return
        if "answer" not in record:
            memory, timings = self.recall(question, conversation)
            date = question.date or (conversation.sessions[-1].date or None)
            text, usage = answer.complete(answer_prompt(question, memory, date))
            self.checkpoint.record_question(
                question.id,
                answer=text,
                block_tokens=self._count(memory) if memory else 0,
                recall_ms=[round(t, 3) for t in timings],
                answer_usage=_usage_json(usage),
            )
            record = self.checkpoint.question(question.id)
        verdict, usage = judge.complete(
            judge_prompt(self.evalset.benchmark, question, str(record["answer"]))
        )
        self.checkpoint.record_question(
            question.id,
            correct=read_verdict(self.evalset.benchmark, verdict),
            judge_usage=_usage_json(usage),
        )
        tick()

    def _check_stop(self) -> None:
        if self._stop.is_set():
            raise RunStopped("stopped")

    # --- the extraction spend
    def read_metrics(self) -> dict[str, int]:
        return read_counts(self._redis, self.settings)

    def erase_users(self) -> int:
        from storage.erasure import erase

        removed = 0
        for conversation in self.evalset.conversations:
            for subject in conversation.subjects:
                user = user_id_for(self.evalset.benchmark, conversation.id, subject)
                removed += erase(self.settings, self._redis, self._storage, user).documents
        return removed


def facts_of(
    checkpoint: Checkpoint, conversations: Sequence[Conversation]
) -> dict[str, list[FactRecord]]:
    found: dict[str, list[FactRecord]] = {}
    for conversation in conversations:
        stored = checkpoint.conversation_facts(conversation.id)
        if stored is not None:
            found[conversation.id] = [
                FactRecord(f["subject"], f["content"], tuple(f["cited"]) if f["cited"] else None)
                for f in stored
            ]
    return found


def _usage_json(usage: Usage) -> dict[str, int]:
    return {
        "calls": usage.calls,
        "prompt_tokens": usage.prompt_tokens,
        "cached_tokens": usage.cached_tokens,
        "completion_tokens": usage.completion_tokens,
    }


def _tick(bar: Any, lock: threading.Lock) -> None:
    with lock:
        bar.update(1)
