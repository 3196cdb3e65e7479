"""What a run asks before its model call: the token budgets, then the shared rate limit.

Built once per process beside the Redis client (the limiter and the budgets hold only that
client and their scripts; their state is in Redis, shared by every process).
"""

from __future__ import annotations

from collections.abc import Callable

from memq.core.connection import RedisClient
from memq.core.settings import MemqSettings
from worker.budget import TokenBudget
from worker.ratelimit import SharedRateLimit

# Told a call's prompt tokens before it is made; raises RunDeferred when it must wait.
Gate = Callable[[int], None]


class RunGates:
    def __init__(self, settings: MemqSettings, client: RedisClient) -> None:
        self.budget = TokenBudget.for_settings(settings, client)
        self.limiter = SharedRateLimit.for_settings(settings, client)

    def admit_batch(self, user_id: str) -> None:
        """Before a run is parked for a batch job: the budgets, as before a call (RunDeferred
        when one is spent). No rate-limit slot: the job is not a call at the rate the limit
        shares; its tokens are spent when its answer is settled."""
        if self.budget is not None:
            self.budget.check(user_id)

    def gate_for(self, user_id: str, slot_ms: int | None) -> Gate | None:
        """The gate of one run of ``user_id`` (None: neither a budget nor a limit is set);
        ``slot_ms``: the rate-limit slot an earlier deferral reserved for it."""
        budget, limiter = self.budget, self.limiter
        if budget is None and limiter is None:
            return None
        rate_gate = None if limiter is None else limiter.gate_for(slot_ms)

        def gate(tokens: int) -> None:
            if budget is not None:  # first: a run the budget holds back takes no rate slot
                budget.check(user_id)
            if rate_gate is not None:
                rate_gate(tokens)

        return gate
