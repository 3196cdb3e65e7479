-- batch_complete.lua — settle a context whose batch answer was applied: as complete.lua does for
-- a synchronous run, and it leaves the batch lane.
--
-- KEYS[1]  ctx:<id>        hash of the context
-- KEYS[2]  batch:out       zset  context id -> time past which its job counts as lost (epoch ms)
-- KEYS[3]  due             zset  context id -> deadline (epoch ms)
-- KEYS[4]  wm:<id>         string, the watermark (JSON list of the last extracted identities)
-- KEYS[5]  batch:job:<id>  hash  claim token -> context id (the job's requests)
-- KEYS[6]  inflight        zset  context id -> lease expiry (a parked context is not in it)
-- KEYS[7]  uleases    hash  user part -> live leases (the per-user cap)
-- KEYS[8]  batch:pending   zset  context id -> time parked (epoch ms)
-- KEYS[9]  claims          hash  context id -> the token of its live claim (claim_due.lua)
--
-- ARGV[1]  context id
-- ARGV[2]  claim token the context was sent with (the request's custom id)
-- ARGV[3]  now_ms            current time, epoch milliseconds (deadline when none is stored)
-- ARGV[4]  watermark         new value of KEYS[4]; "" leaves it as it is
-- ARGV[5]  watermark_ttl_ms  time to live of KEYS[4], milliseconds
--
-- Returns
--   0  stale: the claim moved on (a flush claimed it, it was forgotten); nothing done but the
--      request leaving the job (and the lane's sets, when no batch holds the context now)
--   1  done: the version did not move while the job was out; the hash is deleted
--   2  rescheduled: messages arrived while the job was out; back in `due` at deadline_ms

--- @include "includes/release_claim"
--- @include "includes/requeue"
--- @include "includes/parked_with"
--- @include "includes/leave_batch_lane"

local ctx, out, due, wm, job = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local inflight, leases, pending, claims = KEYS[6], KEYS[7], KEYS[8], KEYS[9]
local id, token = ARGV[1], ARGV[2]

redis.call('HDEL', job, token)
local f = redis.call('HMGET', ctx, 'claim_token', 'batch_token', 'version', 'claimed_version',
  'deadline_ms')
if not parked_with(f[1], f[2], token) then
  if not f[2] then
    leave_batch_lane(ctx, pending, out, id)  -- in no batch any more (else another job holds it)
  end
  return 0
end
if ARGV[4] ~= '' then
  redis.call('SET', wm, ARGV[4], 'PX', ARGV[5])
end
if f[3] == f[4] then
  redis.call('DEL', ctx)
  redis.call('ZREM', due, id)
  leave_batch_lane(ctx, pending, out, id)
  release_claim(ctx, inflight, leases, claims, id)
  return 1
end
redis.call('HSET', ctx, 'attempts', '0')
redis.call('HDEL', ctx, 'last_error')
requeue(ctx, due, id, tonumber(f[5]) and f[5] or ARGV[3])  -- '' (left by the claim): none
leave_batch_lane(ctx, pending, out, id)
release_claim(ctx, inflight, leases, claims, id)
return 2
