-- release.lua — give a claim back at once, without counting an attempt (the task send failed).
--
-- KEYS[1]  ctx:<id>   hash of the context
-- KEYS[2]  inflight   zset  context id -> lease expiry (epoch ms)
-- KEYS[3]  due        zset  context id -> deadline (epoch ms)
-- KEYS[4]  uleases    hash  user part -> live leases (the per-user cap)
-- KEYS[5]  claims     hash  context id -> the token of its live claim (claim_due.lua)
--
-- ARGV[1]  context id
-- ARGV[2]  claim token the ticker got from claim_due
-- ARGV[3]  now_ms   current time, epoch milliseconds: the context is due again at once
--
-- Returns 1 released, 0 stale (the token does not match; nothing done).

--- @include "includes/release_claim"
--- @include "includes/requeue"

local ctx, inflight, due, leases, claims = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local id = ARGV[1]

-- `claims`, not the hash: a claim is given back before its run started (the run's start copies
-- the token into the hash).
if redis.call('HGET', claims, id) ~= ARGV[2] then
  return 0
end
-- An enqueue during the claim stored its own deadline; keep the earlier of the two.
local deadline = tonumber(redis.call('HGET', ctx, 'deadline_ms')) or tonumber(ARGV[3])
deadline = string.format('%d', math.min(deadline, tonumber(ARGV[3])))
requeue(ctx, due, id, deadline)
release_claim(ctx, inflight, leases, claims, id)
return 1
