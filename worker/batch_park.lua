-- batch_park.lua — hand a claimed run to the batch lane: its request waits to be gathered into
-- the shard's next batch job, and the context leaves the lease's reach while it is out.
--
-- KEYS[1]  ctx:<id>          hash of the context
-- KEYS[2]  inflight          zset  context id -> lease expiry (epoch ms)
-- KEYS[3]  uleases    hash  user part -> live leases (the per-user cap)
-- KEYS[4]  batch:pending     zset  context id -> time parked (epoch ms)
--
-- ARGV[1]  context id
-- ARGV[2]  claim token the run holds
-- ARGV[3]  now_ms     current time, epoch milliseconds
-- ARGV[4]  request    the chat completion request body (JSON) the batch job will send
-- ARGV[5]  watermark  the watermark the request covers once applied ("" for none)
-- ARGV[6]  run        what the answer's facts will cite (JSON: message labels, digests, roles)
--
-- Returns
--   0  stale: the token is not the context's claim token; nothing done
--   1  parked: `batch_token` = the claim token, the request and watermark stored in the hash,
--      the id in `batch:pending`, out of `inflight` (the reaper never sees it)
--
-- The claim token stays: it is the batch's fencing token, carried in the hash and (as the
-- request's custom id) in the job. claim_due leaves a context with `batch_token` alone unless it
-- is urgent; a claim then supersedes the batch and the answer is fenced off.

--- @include "includes/leave_lease"

local ctx, inflight, leases, pending = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id, token = ARGV[1], ARGV[2]

if redis.call('HGET', ctx, 'claim_token') ~= token then
  return 0
end
redis.call('HSET', ctx, 'batch_token', token, 'batch_request', ARGV[4],
  'batch_watermark', ARGV[5], 'batch_run', ARGV[6], 'batch_parked_ms', ARGV[3])
redis.call('HDEL', ctx, 'batch_id')
redis.call('ZADD', pending, ARGV[3], id)
-- Out of the lease's sets last, once the id is in `batch:pending`: never in no set.
leave_lease(inflight, leases, id)
return 1
