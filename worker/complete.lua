-- complete.lua — finish a run: drop the context, or reschedule it if messages arrived meanwhile;
-- and advance the thread's extraction watermark, only for the run that still holds the claim.
--
-- KEYS[1]  ctx:<id>   hash of the context
-- KEYS[2]  inflight   zset  context id -> lease expiry (epoch ms)
-- KEYS[3]  due        zset  context id -> deadline (epoch ms)
-- KEYS[4]  wm:<id>    string, the watermark (JSON list of the last extracted message identities)
-- KEYS[5]  uleases    hash  user part -> live leases (the per-user cap)
-- KEYS[6]  claims     hash  context id -> the token of its live claim (claim_due.lua)
--
-- ARGV[1]  context id
-- ARGV[2]  claim token the worker got from claim_due
-- ARGV[3]  now_ms     current time, epoch milliseconds (deadline when none is stored)
-- ARGV[4]  watermark  new value of KEYS[4]; "" leaves it as it is
-- ARGV[5]  watermark_ttl_ms   time to live of KEYS[4], milliseconds
-- ARGV[6]  more       "1": the run extracted only the oldest part of the messages (they did not
--                     fit one prompt); reschedule at now_ms even if the version did not move.
--                     Absent or "0": as before
--
-- Returns
--   0  stale: the token does not match (the lease was reaped and maybe re-claimed); nothing done,
--      the watermark included
--   1  done: the version did not move during the run; the hash is deleted
--   2  rescheduled: an enqueue arrived during the run; back in `due` at the stored deadline_ms
--      (with ARGV[6] "1": at now_ms, or the stored deadline_ms when that is earlier)
--
-- Either way the claim is released last (includes/release_claim.lua), after the hash is deleted or
-- the id is back in `due`.

--- @include "includes/release_claim"
--- @include "includes/requeue"

local ctx, inflight, due, wm, leases = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local claims = KEYS[6]
local id = ARGV[1]

if redis.call('HGET', ctx, 'claim_token') ~= ARGV[2] then
  return 0
end
if ARGV[4] ~= '' then
  redis.call('SET', wm, ARGV[4], 'PX', ARGV[5])
end
local more = ARGV[6] == '1'
if not more and redis.call('HGET', ctx, 'version') == redis.call('HGET', ctx, 'claimed_version') then
  redis.call('DEL', ctx)
  redis.call('ZREM', due, id)
  release_claim(ctx, inflight, leases, claims, id)
  return 1
end
-- No number stored (absent, or '' as the claim leaves it): no turn arrived since the claim.
local deadline = redis.call('HGET', ctx, 'deadline_ms')
if not tonumber(deadline) or (more and tonumber(deadline) > tonumber(ARGV[3])) then
  deadline = ARGV[3]
end
redis.call('HSET', ctx, 'attempts', '0')
redis.call('HDEL', ctx, 'last_error')
requeue(ctx, due, id, deadline)
release_claim(ctx, inflight, leases, claims, id)
return 2
