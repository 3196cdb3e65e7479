-- reap_expired.lua — bring back contexts whose lease expired (their worker died or hung).
--
-- The caller reads candidates with ZRANGEBYSCORE inflight -inf now LIMIT 0 n; each is re-checked.
--
-- KEYS[1]    inflight   zset  context id -> lease expiry (epoch ms)
-- KEYS[2]    due        zset  context id -> deadline (epoch ms)
-- KEYS[3]    dead       zset  context id -> time it died (epoch ms)
-- KEYS[2+2i] ctx:<id>   hash of candidate i (i = 1..n)
-- KEYS[3+2i] uinflight:<user>  zset  candidate i's user's in-flight contexts -> lease expiry
--
-- ARGV[1]    now_ms         current time, epoch milliseconds
-- ARGV[2]    max_attempts   an attempt count reaching this sends the context to `dead` (count)
-- ARGV[2+i]  context id of candidate i
--
-- Returns {requeued, dead}: how many went back to `due` (at now) and how many to `dead`.
-- The claim token is removed, so the lost worker's complete/fail become stale no-ops.

local inflight, due, dead = KEYS[1], KEYS[2], KEYS[3]
local now = tonumber(ARGV[1])
local max_attempts = tonumber(ARGV[2])
local requeued, died = 0, 0

for i = 1, (#KEYS - 3) / 2 do
  local ctx, users, id = KEYS[2 + 2 * i], KEYS[3 + 2 * i], ARGV[2 + i]
  local expiry = tonumber(redis.call('ZSCORE', inflight, id))
  if expiry and expiry <= now then
    redis.call('ZREM', inflight, id)
    redis.call('ZREM', users, id)
    if redis.call('EXISTS', ctx) == 1 then
      local attempts = redis.call('HINCRBY', ctx, 'attempts', 1)
      redis.call('HSET', ctx, 'last_error', 'lease expired')
      redis.call('HDEL', ctx, 'claim_token')
      if attempts >= max_attempts then
        redis.call('HSET', ctx, 'dead_at_ms', ARGV[1])
        redis.call('ZADD', dead, ARGV[1], id)
        died = died + 1
      else
        redis.call('HSET', ctx, 'deadline_ms', ARGV[1])
        redis.call('ZADD', due, ARGV[1], id)
        requeued = requeued + 1
      end
    end
  end
end
return {requeued, died}
