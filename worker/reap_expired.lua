-- reap_expired.lua — bring back contexts whose lease expired (their worker died or hung).
--
-- The caller reads candidates with ZRANGEBYSCORE inflight -inf now LIMIT 0 n; each is re-checked.
--
-- KEYS[1]    inflight   zset  context id -> lease expiry (epoch ms)
-- KEYS[2]    due        zset  context id -> deadline (epoch ms)
-- KEYS[3]    dead       zset  context id -> time it died (epoch ms)
-- KEYS[4]    uleases    hash  user part -> live leases (the per-user cap)
-- KEYS[5]    claims     hash  context id -> the token of its live claim (claim_due.lua)
-- KEYS[5+i]  ctx:<id>   hash of candidate i (i = 1..n)
--
-- ARGV[1]    now_ms         current time, epoch milliseconds
-- ARGV[2]    max_attempts   an attempt count reaching this sends the context to `dead` (count)
-- ARGV[3]    dead_retention_ms  a dead context's hash expires this long after it died (ms)
-- ARGV[3+i]  context id of candidate i
--
-- Returns {requeued, dead}: how many went back to `due` (at now) and how many to `dead`.
-- The claim token is removed, so the lost worker's complete/fail become stale no-ops.
--
-- An expired lease counts as an attempt only when the run had started (its task's first renew set
-- started_token to the claim token) and the version did not move during it:
--   * never started (the task waited in a broker backlog past its expiry and Celery dropped it):
--     requeued, attempts unchanged — work that never ran is no attempt;
--   * the version moved: the new messages never had their own try, so attempts restart at 0, as
--     complete.lua does when it reschedules.
-- The id is put in `due` or `dead` before it leaves `inflight`, so it is never in no set.

--- @include "includes/release_claim"
--- @include "includes/requeue"
--- @include "includes/dead_letter"

local inflight, due, dead, leases, claims = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now = tonumber(ARGV[1])
local max_attempts = tonumber(ARGV[2])
local requeued, died = 0, 0

for i = 1, #KEYS - 5 do
  local ctx, id = KEYS[5 + i], ARGV[3 + i]
  local expiry = tonumber(redis.call('ZSCORE', inflight, id))
  if expiry and expiry <= now then
    local f = redis.call('HMGET', ctx, 'version', 'claimed_version', 'claim_token',
      'started_token', 'attempts')
    if f[1] then
      local attempts = tonumber(f[5]) or 0
      local started = f[3] ~= false and f[3] == f[4]
      local counted = started and f[1] == f[2]
      if counted then
        attempts = attempts + 1
      elseif f[1] ~= f[2] then
        attempts = 0
      end
      if started then
        redis.call('HSET', ctx, 'last_error', 'lease expired')
      end
      redis.call('HSET', ctx, 'attempts', attempts)
      if counted and attempts >= max_attempts then
        dead_letter(ctx, dead, id, ARGV[1], ARGV[3])
        died = died + 1
      else
        requeue(ctx, due, id, ARGV[1])
        requeued = requeued + 1
      end
    end
    release_claim(ctx, inflight, leases, claims, id)
  end
end
return {requeued, died}
