-- release_claim — end the run's claim on a context.
--
-- The id leaves `inflight` and its user's in-flight set (the per-user cap), and the claim and
-- started tokens are cleared, so a late renew, complete, fail or fenced save of that run is a stale
-- no-op; a rate-limit slot reserved for the run goes too (it was for that run only). Call it last,
-- once the id is in `due` or `dead` (or its hash is deleted): a failing script keeps what it
-- already wrote, and the id must never be in no set. Once the user holds no lease, the zset's only
-- other member, the deferral horizon of claim_due.lua, goes with it (it only orders a capped
-- user's backlog).
--
--   ctx       ctx:<id> hash of the context (HDEL on a deleted hash does nothing)
--   inflight  zset  context id -> lease expiry (epoch ms)
--   users     uinflight:<user> zset  the user's in-flight contexts -> lease expiry
--   id        context id
--- @include "includes/leave_lease"
local function release_claim(ctx, inflight, users, id)
  redis.call('HDEL', ctx, 'claim_token', 'started_token', 'rate_slot_ms')
  leave_lease(inflight, users, id)
end
