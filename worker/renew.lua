-- renew.lua — extend the lease of a context this worker still holds; the first renew starts the
-- run.
--
-- KEYS[1]  ctx:<id>   hash of the context
-- KEYS[2]  inflight   zset  context id -> lease expiry (epoch ms)
-- KEYS[3]  uleases    hash  user part -> live leases (the per-user cap)
-- KEYS[4]  claims     hash  context id -> the token of its live claim (claim_due.lua)
--
-- ARGV[1]  context id
-- ARGV[2]  claim token the worker got from claim_due
-- ARGV[3]  lease_until_ms   new lease expiry, epoch milliseconds
--
-- Returns 1 renewed, 0 stale (the token is not the live claim's, or the id is no longer in
-- flight, or the context's hash vanished before its run started).
--
-- The extract task renews first thing, and that first renew starts the run: claim_due.lua
-- touches no context's hash (bench P2), so the run's fields are written here, from what the hash
-- holds now, which is what the worker then reads and extracts (QueueClient.start_run sends this
-- before its read of the hash):
--   claim_token      the token, copied from `claims`: the fenced save, complete, fail, defer and
--                    the batch lane check the hash; every end of the claim clears both
--                    (includes/release_claim.lua)
--   started_token    the same token: the reaper can tell a run that died from a task that never
--                    ran (Celery drops a task whose `expires` passed in a broker backlog) and
--                    counts an attempt only for the former
--   claimed_version  the version this run extracts; its complete compares it with the version
--                    then, and reschedules when a turn arrived during the run
--   pending_since_ms, deadline_ms  set to '' (every reader takes them as numbers: absent): the
--                    run takes the debounce window, so the next enqueue opens a fresh one
--   claimed_sync     "1" when the context is `urgent` (a flush, an over-size context) or sent back
--                    by a failed batch (`batch_fallback`): this run calls the model itself, never
--                    through the batch lane; both marks are handed to it and cleared
-- A hash that vanished (its retention passed) ends the claim here: nothing is left to extract.

--- @include "includes/release_claim"

local ctx, inflight, leases, claims = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local id, token = ARGV[1], ARGV[2]

if redis.call('HGET', claims, id) ~= token then
  return 0
end
if not redis.call('ZSCORE', inflight, id) then
  return 0
end
local f = redis.call('HMGET', ctx, 'started_token', 'version', 'urgent', 'batch_fallback')
if f[1] ~= token then
  if not f[2] then
    release_claim(ctx, inflight, leases, claims, id)
    return 0
  end
  if f[3] or f[4] then
    redis.call('HSET', ctx, 'claim_token', token, 'started_token', token, 'claimed_version', f[2],
      'pending_since_ms', '', 'deadline_ms', '', 'claimed_sync', '1')
    redis.call('HDEL', ctx, 'urgent', 'batch_fallback')
  else
    redis.call('HSET', ctx, 'claim_token', token, 'started_token', token, 'claimed_version', f[2],
      'pending_since_ms', '', 'deadline_ms', '')
  end
end
redis.call('ZADD', inflight, 'XX', ARGV[3], id)
return 1
