-- dead_purge.lua — forget dead contexts for good.
--
-- KEYS[1]    dead       zset  context id -> time it died (epoch ms)
-- KEYS[1+i]  ctx:<id>   hash of dead context i (i = 1..n)
--
-- ARGV[i]    context id i
--
-- Returns the number purged. An id no longer in `dead` (retried, or revived by an enqueue) is
-- left alone, so a purge never deletes new messages.

local dead = KEYS[1]
local purged = 0
for i = 1, #KEYS - 1 do
  if redis.call('ZREM', dead, ARGV[i]) == 1 then
    redis.call('DEL', KEYS[1 + i])
    purged = purged + 1
  end
end
return purged
