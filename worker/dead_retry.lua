-- dead_retry.lua — give dead contexts a new try now, with their attempt count reset.
--
-- KEYS[1]    dead       zset  context id -> time it died (epoch ms)
-- KEYS[2]    due        zset  context id -> deadline (epoch ms)
-- KEYS[2+i]  ctx:<id>   hash of dead context i (i = 1..n)
--
-- ARGV[1]    now_ms   current time, epoch milliseconds: the new deadline
-- ARGV[2]    retention_ms  time to live of a revived hash (as an enqueue sets it), milliseconds
-- ARGV[2+i]  context id i
--
-- Returns the number of contexts moved back to `due` (ids not in `dead` are skipped; a dead id
-- whose hash vanished is just removed from `dead`).

--- @include "includes/requeue"

local dead, due = KEYS[1], KEYS[2]
local retried = 0
for i = 1, #KEYS - 2 do
  local ctx, id = KEYS[2 + i], ARGV[2 + i]
  if redis.call('ZREM', dead, id) == 1 and redis.call('EXISTS', ctx) == 1 then
    redis.call('HSET', ctx, 'attempts', '0')
    redis.call('HDEL', ctx, 'dead_at_ms')
    redis.call('PEXPIRE', ctx, ARGV[2])
    requeue(ctx, due, id, ARGV[1])
    retried = retried + 1
  end
end
return retried
