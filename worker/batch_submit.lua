-- batch_submit.lua — record a batch job the provider accepted: its contexts move from
-- `batch:pending` to `batch:out`, and the job is polled from `batch:jobs`.
--
-- KEYS[1]    batch:pending   zset  context id -> time parked (epoch ms)
-- KEYS[2]    batch:out       zset  context id -> time past which its job counts as lost (epoch ms)
-- KEYS[3]    batch:jobs      zset  batch id -> next poll (epoch ms)
-- KEYS[4]    batch:job:<id>  hash  claim token -> context id (the job's requests)
-- KEYS[4+i]  ctx:<id>        hash of context i (i = 1..n)
--
-- ARGV[1]      batch id (the provider's)
-- ARGV[2]      lost_at_ms   the job counts as lost after this (window + slack), epoch ms
-- ARGV[3]      poll_at_ms   first poll, epoch ms
-- ARGV[4]      job_ttl_ms   time to live of KEYS[4], milliseconds
-- ARGV[3+2i]   context id i
-- ARGV[4+2i]   claim token context i was parked with (its request's custom id)
--
-- Returns the number of contexts recorded as out in this job. A context whose claim moved on
-- while the job was being created (a flush claimed it, it was forgotten) is not recorded: its
-- answer will be ignored. One no longer parked at all leaves `batch:pending`. With none
-- recorded the job is not polled (the caller cancels it).

--- @include "includes/parked_with"
--- @include "includes/leave_batch_lane"

local pending, out, jobs, job = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local moved = 0
for i = 1, (#ARGV - 4) / 2 do
  local ctx, id, token = KEYS[4 + i], ARGV[3 + 2 * i], ARGV[4 + 2 * i]
  local f = redis.call('HMGET', ctx, 'claim_token', 'batch_token', 'batch_id')
  if parked_with(f[1], f[2], token) and not f[3] then
    redis.call('HSET', ctx, 'batch_id', ARGV[1])
    redis.call('HSET', job, token, id)
    redis.call('ZADD', out, ARGV[2], id)
    redis.call('ZREM', pending, id)
    moved = moved + 1
  elseif not f[2] then
    leave_batch_lane(ctx, pending, out, id)
  end
end
if moved > 0 then
  redis.call('PEXPIRE', job, ARGV[4])
  redis.call('ZADD', jobs, ARGV[3], ARGV[1])
end
return moved
