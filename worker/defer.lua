-- defer.lua — give a claim back to run later, without counting an attempt: the run may not call
-- the model yet (the shared rate limit or a token budget is spent until then).
--
-- KEYS[1]  ctx:<id>   hash of the context
-- KEYS[2]  inflight   zset  context id -> lease expiry (epoch ms)
-- KEYS[3]  due        zset  context id -> deadline (epoch ms)
-- KEYS[4]  uleases    hash  user part -> live leases (the per-user cap)
-- KEYS[5]  claims     hash  context id -> the token of its live claim (claim_due.lua)
--
-- ARGV[1]  context id
-- ARGV[2]  claim token the worker got from claim_due
-- ARGV[3]  run_at_ms  epoch milliseconds: due again then (a deadline stored meanwhile by an
--                     enqueue is later overridden too: nothing may run before this)
-- ARGV[4]  slot_ms    epoch milliseconds of the rate-limit slot reserved for the next run, kept
--                     as `rate_slot_ms` in the hash until that run settles; "" = none
--
-- Returns 1 deferred, 0 stale (the token does not match; nothing done).

--- @include "includes/release_claim"
--- @include "includes/requeue"

local ctx, inflight, due, leases, claims = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local id = ARGV[1]

if redis.call('HGET', ctx, 'claim_token') ~= ARGV[2] then
  return 0
end
requeue(ctx, due, id, ARGV[3])
release_claim(ctx, inflight, leases, claims, id)
if ARGV[4] ~= '' then
  redis.call('HSET', ctx, 'rate_slot_ms', ARGV[4])
end
return 1
