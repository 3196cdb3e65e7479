"""Token budgets per user and per deployment: over one, that tenant's contexts wait in `due` for
the next window — nothing dropped, no attempt counted, other tenants unaffected — and then run."""

from __future__ import annotations

import time
from typing import Any

import pytest
import redis

from memq.core.clock import now_ms
from memq.core.errors import RunDeferred
from memq.core.keys import KeySchema
from memq.core.metrics import read_snapshot
from memq.core.settings import MemqSettings
from memq.testing.openai_server import ScriptedOpenAI
from memq.testing.waiting import DEADLINE_SECONDS, wait_for
from producer import MemoryProducer
from tests.support.celery_procs import CeleryProcs, memq_env
from tests.support.clock import Clock
from tests.support.scenarios import facts_of, learn_items, queue_idle, stack_settings, turn
from worker.budget import BudgetPlan, TokenBudget, over_budget, tenant_of
from worker.queue import QueueClient

DAY_MS = 86_400_000
HOSTILE_IDS = ["alice@example.com", "auth0|abc", "\ud800lone", "a\u202eb\x00c", "x" * 5000]


def test_windows_are_aligned_days() -> None:
    plan = BudgetPlan(per_user=10, total=None, window_ms=DAY_MS)
    midnight = 20_000 * DAY_MS
    assert plan.window(midnight) == plan.window(midnight + DAY_MS - 1) == 20_000
    assert plan.next_window_ms(midnight + 5) == midnight + DAY_MS


@pytest.mark.parametrize(
    ("user", "total", "expected"),
    [(0, 0, None), (9, 99, None), (10, 0, "user"), (0, 100, "deployment"), (50, 500, "deployment")],
)
def test_which_budget_is_spent(user: int, total: int, expected: str | None) -> None:
    assert over_budget(BudgetPlan(10, 100, DAY_MS), user, total) == expected


def test_tenant_keys_carry_no_user_id() -> None:
    tenants = {tenant_of(user) for user in HOSTILE_IDS}
    assert len(tenants) == len(HOSTILE_IDS)
    assert not any("alice" in t or "auth0" in t for t in tenants)


@pytest.mark.integration
def test_a_spent_user_waits_for_the_next_window_and_others_go_on(
    settings: MemqSettings, redis_client: redis.Redis
) -> None:
    clock = Clock(20_000 * DAY_MS + 1000)
    budget = TokenBudget(
        BudgetPlan(per_user=100, total=1000, window_ms=DAY_MS),
        redis_client,
        KeySchema(settings.key_prefix),
        clock=clock,
    )
    budget.check("alice@example.com")  # nothing spent yet
    budget.spend("alice@example.com", 100)
    with pytest.raises(RunDeferred) as deferred:
        budget.check("alice@example.com")
    assert deferred.value.reason == "budget"
    assert deferred.value.retry_at_ms == 20_001 * DAY_MS  # the next window, not a drop
    budget.check("bob")  # another tenant is not held back
    budget.spend("bob", 900)
    with pytest.raises(RunDeferred):
        budget.check("carol")  # the deployment's budget is spent for everyone
    clock.now = 20_001 * DAY_MS
    budget.check("alice@example.com")  # a new window: released
    assert budget.spent("alice@example.com") == (0, 0)


@pytest.mark.e2e
@pytest.mark.integration
def test_a_user_over_budget_is_deferred_then_released(
    make_settings: Any,
    openai_server: ScriptedOpenAI,
    celery_procs: CeleryProcs,
    redis_client: redis.Redis,
) -> None:
    window_ms = 8000
    spent_windows = 2  # this window and the next: a loaded machine may turn one before the check
    openai_server.responder = learn_items
    settings: MemqSettings = stack_settings(
        make_settings,
        openai_server,
        llm_budget_tokens_per_user=50,
        llm_budget_window_seconds=window_ms / 1000,
    )
    celery_procs.start_worker(memq_env(settings), concurrency=2)
    celery_procs.start_beat(memq_env(settings))
    queue = QueueClient(settings, redis_client)
    # Start early in a window; alice has spent her budget for it and the next, so her run is
    # deferred however slowly it comes (its check may fall in either window).
    wait_for(lambda: int(time.time() * 1000) % window_ms < 1000, what="a new window")
    plan, schema = (
        BudgetPlan.from_settings(settings),
        KeySchema(settings.key_prefix, settings.shards),
    )
    assert plan is not None
    for ahead in range(spent_windows):

        def in_window(ahead: int = ahead) -> int:
            return now_ms() + ahead * window_ms

        TokenBudget(plan, redis_client, schema, clock=in_window).spend("alice", 50)
    with MemoryProducer(settings) as producer:
        assert producer.flush("t1", "alice", None, turn("item-1"))
        assert producer.flush("t1", "bob", None, turn("item-2"))
    wait_for(lambda: facts_of(settings, "bob"), what="bob extracted at once")
    wait_for(
        lambda: (
            read_snapshot(redis_client, settings, now_ms()).metrics.deferred.get("budget", 0) >= 1
        ),
        what="alice's context deferred",
    )
    assert facts_of(settings, "alice") == []  # held back, not dropped
    assert queue.stats()["due"] == 1
    wait_for(
        lambda: facts_of(settings, "alice") == ["The user owns item-1"],
        timeout=spent_windows * window_ms / 1000 + DEADLINE_SECONDS,
        what="alice extracted once her spent windows are over",
    )
    wait_for(lambda: queue_idle(queue), what="queue idle")
    snapshot = read_snapshot(redis_client, settings, now_ms()).metrics
    assert snapshot.extractions.get("retry", 0) == 0 and queue.stats()["dead"] == 0
    assert openai_server.call_count == 2  # one call each: the deferral never called the model
