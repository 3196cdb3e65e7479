-- renew.lua — extend the lease of a context this worker still holds.
--
-- KEYS[1]  ctx:<id>   hash of the context
-- KEYS[2]  inflight   zset  context id -> lease expiry (epoch ms)
--
-- ARGV[1]  context id
-- ARGV[2]  claim token the worker got from claim_due
-- ARGV[3]  lease_until_ms   new lease expiry, epoch milliseconds
--
-- Returns 1 renewed, 0 stale (token does not match or the id is no longer in flight).
--
-- A renew also marks the claim as started (started_token = the claim token): the extract task
-- renews first thing, so the reaper can tell a run that died from a task that never ran (Celery
-- drops a task whose `expires` passed in a broker backlog) and counts an attempt only for the
-- former.

if redis.call('HGET', KEYS[1], 'claim_token') ~= ARGV[2] then
  return 0
end
if not redis.call('ZSCORE', KEYS[2], ARGV[1]) then
  return 0
end
redis.call('ZADD', KEYS[2], 'XX', ARGV[3], ARGV[1])
redis.call('HSET', KEYS[1], 'started_token', ARGV[2])
return 1
