-- batch_fallback.lua — send a context back to a synchronous run: its batch job failed, expired or
-- was cancelled, its request came back as an error line or not at all, or the job was lost.
--
-- KEYS[1]  ctx:<id>        hash of the context
-- KEYS[2]  batch:out       zset  context id -> time past which its job counts as lost (epoch ms)
-- KEYS[3]  batch:pending   zset  context id -> time parked (epoch ms)
-- KEYS[4]  due             zset  context id -> deadline (epoch ms)
-- KEYS[5]  batch:job:<id>  hash  claim token -> context id (the job's requests)
-- KEYS[6]  inflight        zset  context id -> lease expiry (a parked context is not in it)
-- KEYS[7]  uleases    hash  user part -> live leases (the per-user cap)
-- KEYS[8]  claims          hash  context id -> the token of its live claim (claim_due.lua)
--
-- ARGV[1]  context id
-- ARGV[2]  claim token the context was parked with
-- ARGV[3]  now_ms   current time, epoch milliseconds: the context is due at once
--
-- Returns
--   0  stale: the claim moved on; nothing done but the request leaving the job
--   1  due now with `batch_fallback` set: the next claim runs it synchronously. No attempt is
--      counted (the model was never asked by us), and the watermark is left where it was, so
--      exactly the messages the job held are sent again.

--- @include "includes/release_claim"
--- @include "includes/requeue"
--- @include "includes/parked_with"
--- @include "includes/leave_batch_lane"

local ctx, out, pending, due, job = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local inflight, leases, claims = KEYS[6], KEYS[7], KEYS[8]
local id, token = ARGV[1], ARGV[2]

redis.call('HDEL', job, token)
local f = redis.call('HMGET', ctx, 'claim_token', 'batch_token')
if not parked_with(f[1], f[2], token) then
  if not f[2] then
    leave_batch_lane(ctx, pending, out, id)
  end
  return 0
end
redis.call('HSET', ctx, 'batch_fallback', '1')
requeue(ctx, due, id, ARGV[3])
leave_batch_lane(ctx, pending, out, id)
release_claim(ctx, inflight, leases, claims, id)
return 1
