"""The queue as a worker meets it, for tests of what follows a claim: each claimed run starts at
once (its task's first renew, worker/renew.lua), which is when a context's hash gets the run's
fields (claim_token, claimed_version, the closed debounce window). claim_due.lua itself touches no
context's hash, so a complete, fail or defer sent straight after a bare claim finds no run."""

from __future__ import annotations

from worker.queue import ClaimBatch, QueueClient


class StartingQueue(QueueClient):
    def claim(self, now: int | None = None, limit: int | None = None) -> ClaimBatch:
        """Claim, then start each claimed run at ``now``; a run whose start found its claim gone
        (its hash vanished) is left out, as its worker would drop it."""
        batch = super().claim(now, limit)
        started = [c for c in batch.claims if self.renew(c.context_id, c.token, now)]
        return ClaimBatch(
            claims=started, examined=batch.examined, full=batch.full, deferred=batch.deferred
        )

    def claimed_version(self, context_id: str) -> int:
        """The version the context's started run extracts."""
        return int(self.load(context_id).get("claimed_version") or 0)
