"""Token budgets: how many LLM tokens one user, and the whole deployment, may spend per window.

Over a budget, the run does not call the model: it goes back to `due` at the start of the next
window (``RunDeferred``, reason ``budget``), so nothing is dropped and no attempt is counted; other
users' runs go on. Spending is counted after each call (prompt + completion tokens, a stale run's
included: they were spent), so the call that crosses a budget completes and the next one waits.

Counters are plain ``INCRBY`` keys per window (``budget:<window>:<tenant>``) that expire two
windows later; a user's key is named by a hash of the user id, so no id sits in a key name past
the user's erasure. Windows are aligned to the epoch (a day: UTC midnight).
"""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import redis

from memq.core.clock import now_ms
from memq.core.connection import RedisClient
from memq.core.errors import RunDeferred
from memq.core.keys import KeySchema
from memq.core.settings import MemqSettings

log = logging.getLogger(__name__)

DEPLOYMENT = "*"


@dataclass(frozen=True, slots=True)
class BudgetPlan:
    per_user: int | None
    total: int | None
    window_ms: int

    @classmethod
    def from_settings(cls, settings: MemqSettings) -> BudgetPlan | None:
        """None when no budget is set."""
        if settings.llm_budget_tokens_per_user is None and settings.llm_budget_tokens_total is None:
            return None
        return cls(
            settings.llm_budget_tokens_per_user,
            settings.llm_budget_tokens_total,
            int(settings.llm_budget_window_seconds * 1000),
        )

    def window(self, at_ms: int) -> int:
        return at_ms // self.window_ms

    def next_window_ms(self, at_ms: int) -> int:
        return (self.window(at_ms) + 1) * self.window_ms


def tenant_of(user_id: str) -> str:
    return hashlib.sha256(user_id.encode("utf-8", "surrogatepass")).hexdigest()[:16]


def over_budget(plan: BudgetPlan, user_spent: int, total_spent: int) -> str | None:
    """Which budget is spent ("user", "deployment"), None when neither."""
    if plan.total is not None and total_spent >= plan.total:
        return "deployment"
    if plan.per_user is not None and user_spent >= plan.per_user:
        return "user"
    return None


class TokenBudget:
    """Checks and counts the budgets in Redis; Redis errors admit the call (fails open)."""

    def __init__(
        self,
        plan: BudgetPlan,
        client: RedisClient,
        schema: KeySchema,
        *,
        clock: Callable[[], int] = now_ms,
    ) -> None:
        self._plan = plan
        self._client = client
        self._schema = schema
        self._clock = clock

    @classmethod
    def for_settings(cls, settings: MemqSettings, client: RedisClient) -> TokenBudget | None:
        plan = BudgetPlan.from_settings(settings)
        if plan is None:
            return None
        return cls(plan, client, KeySchema(settings.key_prefix, settings.shards))

    def _keys(self, user_id: str, at_ms: int) -> tuple[str, str]:
        window = self._plan.window(at_ms)
        return (
            self._schema.token_budget(window, tenant_of(user_id)),
            self._schema.token_budget(window, DEPLOYMENT),
        )

    def spent(self, user_id: str) -> tuple[int, int]:
        """(the user's, the deployment's) tokens spent in the current window."""
        pipe = self._client.pipeline(transaction=False)
        for key in self._keys(user_id, self._clock()):  # two slots on a cluster: no MGET
            pipe.get(key)
        user, total = pipe.execute()
        return int(user or 0), int(total or 0)

    def check(self, user_id: str) -> None:
        """Raise :class:`RunDeferred` (to the next window) when a budget of ``user_id`` is spent."""
        now = self._clock()
        try:
            user, total = self.spent(user_id)
        except (redis.RedisError, ValueError) as exc:
            log.warning("token budget unreadable, admitting the call: %s", exc)
            return
        which = over_budget(self._plan, user, total)
        if which is not None:
            raise RunDeferred(
                f"LLM token budget of the {which} spent until the next window",
                retry_at_ms=self._plan.next_window_ms(now),
                reason="budget",
            )

    def spend(self, user_id: str, tokens: int) -> None:
        if tokens <= 0:
            return
        try:
            pipe = self._client.pipeline(transaction=False)
            self._count(pipe, user_id, tokens)
            pipe.execute()
        except redis.RedisError as exc:
            log.warning("token budget not counted: %s", exc)

    def queue_spend(self, pipe: Any, user_id: str, tokens: int) -> bool:
        """:meth:`spend` queued on ``pipe``, a plain pipeline of this budget's own client (the
        settlement's round trip), whose replies are not looked at; False when nothing was
        queued (nothing to count, or another client: the caller then calls :meth:`spend`)."""
        client = self._client
        if tokens <= 0 or not isinstance(client, redis.Redis):
            return False
        if not isinstance(pipe, redis.client.Pipeline) or pipe.connection_pool is not (
            client.connection_pool
        ):
            return False
        self._count(pipe, user_id, tokens)
        return True

    def _count(self, pipe: Any, user_id: str, tokens: int) -> None:
        for key in self._keys(user_id, self._clock()):
            pipe.incrby(key, tokens)
            pipe.pexpire(key, 2 * self._plan.window_ms)
