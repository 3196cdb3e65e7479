-- erase_contexts.lua — remove contexts of one user from every queue structure of one shard.
--
-- KEYS[1]      due        zset  context id -> deadline (epoch ms)
-- KEYS[2]      inflight   zset  context id -> lease expiry (epoch ms)
-- KEYS[3]      dead       zset  context id -> time it died (epoch ms)
-- KEYS[4]      uleases    hash  user part -> live leases in this shard (the per-user cap)
-- KEYS[5]      uctx:<user>       set   the user's context ids in this shard
-- KEYS[6]      batch:pending  zset  contexts parked for the next batch job
-- KEYS[7]      batch:out      zset  contexts out in a batch job
-- KEYS[8]      claims     hash  context id -> the token of its live claim (claim_due.lua)
-- KEYS[7+2i]   ctx:<id>   hash of context i (i = 1..n)
-- KEYS[8+2i]   wm:<id>    string, the watermark of context i
--
-- ARGV[1]      "1": also delete the user's count and horizon in KEYS[4] and KEYS[5] whole (the
--              user is erased, not one agent)
-- ARGV[2]      the user's key part (as its context ids carry it)
-- ARGV[2+i]    context id i
--
-- Returns {pending, in_flight, dead, contexts, watermarks, user_sets}: how many ids left `due`,
-- `inflight` (or the batch lane's two sets) and `dead`, how many hashes and watermarks were
-- deleted, and how many of the user's two records (its lease count, its context set) existed
-- before (ARGV[1] = "1" only).
--
-- Erasing one agent leaves the user's lease count as a released claim would: gone, with its
-- deferral horizon, once the user holds no lease (includes/leave_lease.lua).
--
-- Deleting the hash of a context in flight fences its run: the run's claim token is gone, so its
-- save, renew and complete are refused and the memory is never re-created by it. The same holds
-- for a context out in a batch job: its answer, when it comes back, finds no claim and writes
-- nothing (the job's own record, token -> id, is dropped when the job is settled).

--- @include "includes/release_claim"

local due, inflight, dead, leases, users_contexts = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local batch_pending, batch_out, claims = KEYS[6], KEYS[7], KEYS[8]
local out = {0, 0, 0, 0, 0, 0}
if ARGV[1] == '1' then
  out[6] = redis.call('HEXISTS', leases, ARGV[2]) + redis.call('EXISTS', users_contexts)
end
for i = 1, #ARGV - 2 do
  local id, ctx, wm = ARGV[2 + i], KEYS[7 + 2 * i], KEYS[8 + 2 * i]
  out[1] = out[1] + redis.call('ZREM', due, id)
  if redis.call('ZSCORE', inflight, id) then
    out[2] = out[2] + 1
  end
  out[2] = out[2] + redis.call('ZREM', batch_pending, id) + redis.call('ZREM', batch_out, id)
  out[3] = out[3] + redis.call('ZREM', dead, id)
  redis.call('SREM', users_contexts, id)
  out[4] = out[4] + redis.call('DEL', ctx)
  out[5] = out[5] + redis.call('DEL', wm)
  -- Last, as everywhere: the hash is gone, so the run in flight is fenced already.
  release_claim(ctx, inflight, leases, claims, id)
end
if ARGV[1] == '1' then
  redis.call('HDEL', leases, ARGV[2], '~' .. ARGV[2])
  redis.call('DEL', users_contexts)
end
return out
