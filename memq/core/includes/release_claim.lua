-- release_claim — end the run's claim on a context.
--
-- The id leaves `inflight` and its user's live leases (the per-user cap), and the claim and
-- started tokens are cleared, so a late renew, complete, fail or fenced save of that run is a stale
-- no-op; a rate-limit slot reserved for the run and its `claimed_sync` mark go too (they were for
-- that run only: claim_due.lua writes the mark only when it is set). Call it last,
-- once the id is in `due` or `dead` (or its hash is deleted): a failing script keeps what it
-- already wrote, and the id must never be in no set.
--
--   ctx       ctx:<id> hash of the context (HDEL on a deleted hash does nothing)
--   inflight  zset  context id -> lease expiry (epoch ms)
--   leases    uleases hash  user part -> live leases in this shard (includes/leave_lease.lua)
--   id        context id
--- @include "includes/leave_lease"
local function release_claim(ctx, inflight, leases, id)
  redis.call('HDEL', ctx, 'claim_token', 'started_token', 'rate_slot_ms', 'claimed_sync')
  leave_lease(inflight, leases, id)
end
