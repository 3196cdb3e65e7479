-- release_claim — end the run's claim on a context.
--
-- The id leaves `inflight`, `claims` and its user's live leases (the per-user cap), and the
-- run's tokens its start wrote (worker/renew.lua) are cleared, so a late renew, complete, fail or
-- fenced save of that run is a stale no-op; a rate-limit slot reserved for the run and its
-- `claimed_sync` mark go too (they were for that run only). `claimed_version` stays: it is the
-- version the last run that started tried, and the reaper compares it with the version when a
-- later claim expires before its run started (no turn since: earlier failures still count).
-- Call it last,
-- once the id is in `due` or `dead` (or its hash is deleted): a failing script keeps what it
-- already wrote, and the id must never be in no set.
--
--   ctx       ctx:<id> hash of the context (HDEL on a deleted hash does nothing)
--   inflight  zset  context id -> lease expiry (epoch ms)
--   leases    uleases hash  user part -> live leases in this shard (includes/leave_lease.lua)
--   claims    hash  context id -> the token of its live claim (claim_due.lua)
--   id        context id
--- @include "includes/leave_lease"
local function release_claim(ctx, inflight, leases, claims, id)
  redis.call('HDEL', ctx, 'claim_token', 'started_token', 'rate_slot_ms', 'claimed_sync')
  redis.call('HDEL', claims, id)
  leave_lease(inflight, leases, id)
end
