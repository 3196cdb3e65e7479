-- batch_unlock.lua — give a shard's batch lock back, only if it is still ours.
--
-- KEYS[1]  batch:lock  string  the holder's random token (SET NX PX by the cycle that took it)
--
-- ARGV[1]  the token this cycle took the lock with
--
-- Returns 1 when released, 0 when the lock had expired and may now be another cycle's (left).

if redis.call('GET', KEYS[1]) == ARGV[1] then
  return redis.call('DEL', KEYS[1])
end
return 0
