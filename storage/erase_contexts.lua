-- erase_contexts.lua — remove contexts of one user from every queue structure of one shard.
--
-- KEYS[1]      due        zset  context id -> deadline (epoch ms)
-- KEYS[2]      inflight   zset  context id -> lease expiry (epoch ms)
-- KEYS[3]      dead       zset  context id -> time it died (epoch ms)
-- KEYS[4]      uinflight:<user>  zset  the user's in-flight contexts in this shard
-- KEYS[5]      uctx:<user>       set   the user's context ids in this shard
-- KEYS[6]      batch:pending  zset  contexts parked for the next batch job
-- KEYS[7]      batch:out      zset  contexts out in a batch job
-- KEYS[6+2i]   ctx:<id>   hash of context i (i = 1..n)
-- KEYS[7+2i]   wm:<id>    string, the watermark of context i
--
-- ARGV[1]      "1": also delete KEYS[4] and KEYS[5] whole (the user is erased, not one agent)
-- ARGV[1+i]    context id i
--
-- Returns {pending, in_flight, dead, contexts, watermarks, user_sets}: how many ids left `due`,
-- `inflight` (or the batch lane's two sets) and `dead`, how many hashes and watermarks were
-- deleted, and how many of the two per-user keys existed before (ARGV[1] = "1" only).
--
-- Erasing one agent leaves the per-user in-flight set as a released claim would: gone once it
-- holds no lease (only the `~defer` horizon of claim_due.lua).
--
-- Deleting the hash of a context in flight fences its run: the run's claim token is gone, so its
-- save, renew and complete are refused and the memory is never re-created by it. The same holds
-- for a context out in a batch job: its answer, when it comes back, finds no claim and writes
-- nothing (the job's own record, token -> id, is dropped when the job is settled).

local due, inflight, dead, users_inflight, users_contexts = KEYS[1], KEYS[2], KEYS[3], KEYS[4],
  KEYS[5]
local batch_pending, batch_out = KEYS[6], KEYS[7]
local out = {0, 0, 0, 0, 0, 0}
if ARGV[1] == '1' then
  out[6] = redis.call('EXISTS', users_inflight, users_contexts)
end
for i = 1, #ARGV - 1 do
  local id, ctx, wm = ARGV[1 + i], KEYS[6 + 2 * i], KEYS[7 + 2 * i]
  out[1] = out[1] + redis.call('ZREM', due, id)
  out[2] = out[2] + redis.call('ZREM', inflight, id) + redis.call('ZREM', batch_pending, id)
    + redis.call('ZREM', batch_out, id)
  out[3] = out[3] + redis.call('ZREM', dead, id)
  redis.call('ZREM', users_inflight, id)
  redis.call('SREM', users_contexts, id)
  out[4] = out[4] + redis.call('DEL', ctx)
  out[5] = out[5] + redis.call('DEL', wm)
end
if ARGV[1] == '1' then
  redis.call('DEL', users_inflight, users_contexts)
elseif redis.call('ZCARD', users_inflight) == 1 and redis.call('ZSCORE', users_inflight, '~defer') then
  -- One agent erased, and with it the user's last lease: the claim's deferral horizon, the set's
  -- only other member, goes with the set, as when a run ends (worker/includes/release_claim.lua).
  redis.call('DEL', users_inflight)
end
return out
