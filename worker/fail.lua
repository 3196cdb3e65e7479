-- fail.lua — record a failed run: retry later, or dead-letter the context with the reason.
--
-- KEYS[1]  ctx:<id>   hash of the context
-- KEYS[2]  inflight   zset  context id -> lease expiry (epoch ms)
-- KEYS[3]  due        zset  context id -> deadline (epoch ms)
-- KEYS[4]  dead       zset  context id -> time it died (epoch ms)
-- KEYS[5]  uinflight:<user>  zset  the user's in-flight contexts -> lease expiry (per-user cap)
--
-- ARGV[1]  context id
-- ARGV[2]  claim token the worker got from claim_due
-- ARGV[3]  now_ms         current time, epoch milliseconds
-- ARGV[4]  reason         last_error text (no message content)
-- ARGV[5]  retry_at_ms    when to try again, epoch milliseconds; "-1" = permanent, dead at once
-- ARGV[6]  max_attempts   an attempt count reaching this sends the context to `dead` (count)
--
-- Returns
--   0  stale: the token does not match; nothing done
--   1  retry: back in `due` at retry_at_ms
--   2  dead: moved to `dead` with dead_at_ms and last_error

local ctx, inflight, due, dead, users = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local id = ARGV[1]

if redis.call('HGET', ctx, 'claim_token') ~= ARGV[2] then
  return 0
end
redis.call('ZREM', inflight, id)
redis.call('ZREM', users, id)
redis.call('HDEL', ctx, 'claim_token')
local attempts = redis.call('HINCRBY', ctx, 'attempts', 1)
redis.call('HSET', ctx, 'last_error', ARGV[4])
if ARGV[5] == '-1' or attempts >= tonumber(ARGV[6]) then
  redis.call('HSET', ctx, 'dead_at_ms', ARGV[3])
  redis.call('ZADD', dead, ARGV[3], id)
  return 2
end
redis.call('HSET', ctx, 'deadline_ms', ARGV[5])
redis.call('ZADD', due, ARGV[5], id)
return 1
