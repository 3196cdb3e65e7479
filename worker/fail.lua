-- fail.lua — record a failed run: retry later, or dead-letter the context with the reason.
--
-- KEYS[1]  ctx:<id>   hash of the context
-- KEYS[2]  inflight   zset  context id -> lease expiry (epoch ms)
-- KEYS[3]  due        zset  context id -> deadline (epoch ms)
-- KEYS[4]  dead       zset  context id -> time it died (epoch ms)
-- KEYS[5]  uleases    hash  user part -> live leases (the per-user cap)
-- KEYS[6]  claims     hash  context id -> the token of its live claim (claim_due.lua)
--
-- ARGV[1]  context id
-- ARGV[2]  claim token the worker got from claim_due
-- ARGV[3]  now_ms         current time, epoch milliseconds
-- ARGV[4]  reason         last_error text (no message content)
-- ARGV[5]  retry_at_ms    when to try again, epoch milliseconds; "-1" = permanent, dead at once
-- ARGV[6]  max_attempts   an attempt count reaching this sends the context to `dead` (count)
-- ARGV[7]  dead_retention_ms  a dead context's hash expires this long after it died (ms)
--
-- Returns
--   0  stale: the token does not match; nothing done
--   1  retry: back in `due` at retry_at_ms
--   2  dead: moved to `dead` with dead_at_ms and last_error
--
-- When the version moved during the run (an enqueue arrived), what failed was the claimed version;
-- the new messages never had their own try. So the context is not dead-lettered: its attempts
-- restart at 0 (as complete.lua does when it reschedules) and it is due again at retry_at_ms, or,
-- after a permanent error, at the deadline that enqueue stored (now when there is none) — code 1.
-- The id is put in `due` or `dead` before it leaves `inflight`, so it is never in no set.

--- @include "includes/release_claim"
--- @include "includes/requeue"
--- @include "includes/dead_letter"

local ctx, inflight, due, dead, leases = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local claims = KEYS[6]
local id = ARGV[1]

local f = redis.call('HMGET', ctx, 'claim_token', 'version', 'claimed_version', 'attempts',
  'deadline_ms')
if f[1] ~= ARGV[2] then
  return 0
end
local code = 1
local retry_at = ARGV[5]
if f[2] ~= f[3] then
  if retry_at == '-1' then
    retry_at = string.format('%d', math.max(tonumber(f[5]) or 0, tonumber(ARGV[3])))
  end
  redis.call('HSET', ctx, 'attempts', '0', 'last_error', ARGV[4])
  requeue(ctx, due, id, retry_at)
else
  local attempts = (tonumber(f[4]) or 0) + 1
  redis.call('HSET', ctx, 'attempts', attempts, 'last_error', ARGV[4])
  if retry_at == '-1' or attempts >= tonumber(ARGV[6]) then
    dead_letter(ctx, dead, id, ARGV[3], ARGV[7])
    code = 2
  else
    requeue(ctx, due, id, retry_at)
  end
end
release_claim(ctx, inflight, leases, claims, id)
return code
