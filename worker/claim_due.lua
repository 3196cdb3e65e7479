-- claim_due.lua — move due contexts whose deadline passed into `inflight` with a lease.
--
-- One round trip: the script reads its candidates itself (ZRANGEBYSCORE due -inf now LIMIT 0 n),
-- so the caller sends 7 keys and 7 arguments whatever the batch size. The read and the checks
-- are one atomic step, so two tickers racing never claim one context twice.
--
-- A claim touches no key per candidate (bench P2, docs/benchmarks.md: a read and a write of each
-- candidate's hash were two thirds of a claim of 100 among a million, the hashes being cold in
-- the CPU's caches). Every check is one call over all candidates, and the claim itself is one
-- HSET of `claims` (id -> token): that entry is the fence every later step of the run is checked
-- against. The context's own hash gets the run's fields (claim_token, claimed_version, the
-- closed debounce window, claimed_sync) when the run starts (worker/renew.lua), from what the
-- hash holds then, the same moment the worker reads the messages it extracts.
--
-- KEYS[1]  due        zset  context id -> deadline (epoch ms)
-- KEYS[2]  inflight   zset  context id -> lease expiry (epoch ms)
-- KEYS[3]  epoch      string  the shard's claim counter: each claim token is its next value,
--                             and at least ARGV[1] * 1000 (see reserve_tokens)
-- KEYS[4]  batch:pending  zset  context id -> time parked (a claim supersedes a parked run)
-- KEYS[5]  batch:out  zset  context id -> time past which its job counts as lost (likewise)
-- KEYS[6]  uleases    hash  user part -> the user's ids in `inflight`; `~<user part>` -> the
--                           user's deferral horizon (includes/leave_lease.lua)
-- KEYS[7]  claims     hash  context id -> the token of its live claim
--
-- ARGV[1]  now_ms         current time, epoch milliseconds
-- ARGV[2]  lease_ms       how long a claim holds the context, milliseconds; also how far past
--                         now a capped user's deferral horizon may go
-- ARGV[3]  max_inflight   stop claiming when `inflight` holds this many ids (count)
-- ARGV[4]  user_cap       a user holding this many live leases gets no more claims (count)
-- ARGV[5]  defer_ms       a capped candidate's place in `due` moves to now + defer_ms at the
--                         earliest (ms; one tick), see "Bulk skip" below
-- ARGV[6]  limit          examine at most this many due candidates (count)
-- ARGV[7]  ctx_prefix     a candidate's hash is ctx_prefix .. id (`ctx:<id>`); read only for a
--                         candidate in the batch lane
--
-- Returns {status, deferred, first_token, examined, id_1, id_2, ...}, where
--   status   1  every candidate was examined
--            2  stopped early: `inflight` is full (backpressure)
--   deferred    how many due candidates were left in `due` because their user was at user_cap
--   first_token the claim token of id_1; id_k's is first_token + k - 1 (one INCRBY reserved them
--               in order), so the tokens are not repeated in the reply; 0 when none was claimed
--   examined    how many due candidates the range read found (0: nothing is due)
-- A candidate already in flight is removed from `due` (its complete reschedules it from
-- deadline_ms), and so is one parked for or out in a batch job unless it is `urgent` (a flush):
-- an urgent one is claimed, taken out of the lane (includes/leave_batch_lane.lua) and its old
-- run's claim_token cleared, so the batch's answer is fenced off. A candidate whose hash vanished
-- (its retention passed) is claimed like any other; its run finds no hash at start and ends the
-- claim there (worker/renew.lua), as it would for a hash that vanished a moment after the claim.
--
-- Calls per claim: the range read, ZMSCORE of `inflight`, `batch:pending` and `batch:out`, an
-- HMGET of the users' lease counts, ZCARD, one INCRBY reserving every token, one HSET of
-- `claims`, one HSET of the users' counts, the bulk ZADD and ZREM: 11, whatever the batch size
-- (plus an HGET, and the lane's calls, per candidate in the batch lane). bench P2 counts them
-- with INFO commandstats. The counts live in one hash per shard, not a zset per user: a key
-- created and deleted per user and claim cost ~0.4 ms of a claim of 100 among a million keys
-- (docs/benchmarks.md, "Issue 33's P2, third round").
--
-- Fairness: a capped candidate only moves back in `due`, so the next batch reaches other users'
-- due keys instead of the same wall of one user's. Its hash keeps deadline_ms: that is its real
-- deadline (an enqueue must not push an already-due key back), the zset score is just its turn.
-- A user's count is its ids in `inflight`: a lease lost with its worker is counted until the
-- reaper, first in every tick, ends it, so a lost complete never starves a user for longer than
-- one lease and a tick.
--
-- Bulk skip: a capped user's candidates are not all put back at the next tick (a backlog of
-- 100,000 would then be re-deferred on every tick, all of it), but queued behind each other,
-- 2 * user_cap per tick, from the user's deferral horizon: each tick then meets about that many
-- of the user's keys, in the order they were deferred. The horizon is kept in `uleases` as the
-- field `~<user part>` (a user part is encoded, never holding a `~`); it never passes now +
-- lease_ms (by then every run the user holds has ended or been reaped, so the backlog is looked
-- at again), and it goes with the user's count once the user holds no lease
-- (includes/leave_lease.lua).
--
-- Bulk calls go in chunks of at most CHUNK elements: Lua 5.1's unpack stops near 8000 values, and
-- Redis does not roll back what a failing script already wrote. Writes are ordered so that a
-- claimed id is in `inflight` (and `claims`) before it leaves `due`: a failure can never leave it
-- in no set.

--- @include "includes/leave_batch_lane"
--- @include "includes/user_part"

local due, inflight, epoch, pending, batched = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local claims = KEYS[7]

-- A replica promoted after its primary died may have missed the last INCRs of the counter (the
-- replication is asynchronous), and would hand out again a token that a run of the dead primary
-- still holds. So the counter never falls below now_ms * 1000: a failover takes seconds, and the
-- floor has passed every token issued before it (unless one shard made a million claims in
-- that time). Tokens stay integers below 2^53, exact in Lua's numbers.
local token_floor = tonumber(ARGV[1]) * 1000
-- The first of `count` consecutive tokens, reserved in one write (the counter ends at the last).
local function reserve_tokens(count)
  local last = redis.call('INCRBY', epoch, count)
  if last - count + 1 < token_floor then
    last = token_floor + count - 1
    redis.call('SET', epoch, string.format('%d', last))
  end
  return last - count + 1
end
local now = tonumber(ARGV[1])
local lease_until = string.format('%d', now + tonumber(ARGV[2]))
local cap = tonumber(ARGV[3])
local user_cap = tonumber(ARGV[4])
local defer_from = now + tonumber(ARGV[5])
local defer_until = math.max(defer_from, now + tonumber(ARGV[2]))
local defer_step = tonumber(ARGV[5]) / (2 * user_cap)
local horizon = {}  -- user part -> where its next capped candidate goes in `due`
local leases_of = KEYS[6]
local ctx_prefix = ARGV[7]
local out = {1, 0, 0, 0}
local ids = redis.call('ZRANGEBYSCORE', due, '-inf', ARGV[1], 'LIMIT', 0, tonumber(ARGV[6]))
local n = #ids
out[4] = n
if n == 0 then return out end

local CHUNK = 500

-- redis.call(cmd, key, <list>) in chunks of at most CHUNK values, `step` values per element so a
-- score is never split from its member.
local function bulk(cmd, key, list, step)
  local size = CHUNK - CHUNK % step
  for from = 1, #list, size do
    redis.call(cmd, key, unpack(list, from, math.min(from + size - 1, #list)))
  end
end

-- One batched read instead of a read per candidate (ZMSCORE needs Redis 6.2, our floor).
local function read_each(cmd, key, list)
  if n <= CHUNK then return redis.call(cmd, key, unpack(list)) end  -- no copy
  local result = {}
  for from = 1, n, CHUNK do
    local reply = redis.call(cmd, key, unpack(list, from, math.min(from + CHUNK - 1, n)))
    for j = 1, #reply do result[from + j - 1] = reply[j] end
  end
  return result
end
local leases = read_each('ZMSCORE', inflight, ids)
-- The batch lane's two sets, each read once for every candidate: a context in the lane is rare,
-- and only such a one has its hash read (is it urgent?).
local parked = read_each('ZMSCORE', pending, ids)
local sent = read_each('ZMSCORE', batched, ids)
local users = {}
for i = 1, n do users[i] = user_part(ids[i]) end
local counts = read_each('HMGET', leases_of, users)  -- each candidate's user's live leases
local count = redis.call('ZCARD', inflight)
local count_before = count
local SMALL_ZSET = 128
local held = {}  -- user part -> live leases, as this call moves them
local gained, gained_set = {}, {}  -- the user parts this call gave a lease, each once
local lane = {}  -- id -> true: claimed out of the batch lane (urgent)
local drop, new_ids, lease_args, defer_args = {}, {}, {}, {}

for i = 1, n do
  local id, user = ids[i], users[i]
  local in_lane = parked[i] or sent[i]
  if leases[i] then
    -- In flight already: its complete reschedules it from deadline_ms.
    drop[#drop + 1] = id
  elseif in_lane and not redis.call('HGET', ctx_prefix .. id, 'urgent') then
    -- Parked for, or out in, a batch job: like a run in flight, its settlement reschedules it
    -- from deadline_ms. Urgent work (a flush) is claimed anyway: the new token fences the
    -- batch's answer off, and this run extracts everything after the watermark.
    drop[#drop + 1] = id
  elseif count >= cap then
    out[1] = 2
    break
  else
    local user_held = held[user] or tonumber(counts[i]) or 0
    if user_held >= user_cap then
      local at = horizon[user]
      if not at then
        at = tonumber(redis.call('HGET', leases_of, '~' .. user)) or defer_from
      end
      at = math.min(math.max(at, defer_from), defer_until)
      defer_args[#defer_args + 1] = string.format('%.3f', at)
      defer_args[#defer_args + 1] = id
      horizon[user] = at + defer_step
    else
      drop[#drop + 1] = id
      new_ids[#new_ids + 1] = id
      count = count + 1
      if not gained_set[user] then
        gained_set[user] = true
        gained[#gained + 1] = user
      end
      user_held = user_held + 1
      if in_lane then lane[id] = true end
    end
    held[user] = user_held
  end
end
if #new_ids > 0 then
  -- The shard's counter never goes back, even when a hash is deleted and re-created, so a
  -- token is unique and a newer claim of a context always has a larger one: the storage
  -- fences saves with it (a run from an earlier claim can never match, nor outrank).
  local first = reserve_tokens(#new_ids)
  out[3] = string.format('%d', first)
  local claim_args = {}
  for k = 1, #new_ids do
    local id = new_ids[k]  -- not sorted yet: claim order, as the tokens
    claim_args[2 * k - 1] = id
    claim_args[2 * k] = string.format('%d', first + k - 1)
    out[#out + 1] = id
    if lane[id] then
      -- Superseded by this claim: out of the lane, and this claim's token on its hash at once,
      -- so the parked run's batch answer and fenced save no longer match. The run is not
      -- started yet (`started_token` cleared): its start writes the rest.
      local ctx = ctx_prefix .. id
      leave_batch_lane(ctx, pending, batched, id)
      redis.call('HSET', ctx, 'claim_token', claim_args[2 * k], 'started_token', '')
    end
  end
  bulk('HSET', claims, claim_args, 2)
end
if count_before <= SMALL_ZSET then
  -- A zset of up to 128 members (Redis's zset-max-ziplist-entries) is one packed list: each
  -- ZADD member is found and placed by walking it. The new leases share one score, so added in
  -- descending member order each lands at the front of its score's run instead of its end (a
  -- claim of 100 into an empty `inflight`: ~1.7 ms of script time instead of ~1.9 ms).
  table.sort(new_ids)  -- ascending, without a Lua comparator (cheaper); read backwards below
end
for k = 1, #new_ids do
  lease_args[2 * k - 1] = lease_until
  lease_args[2 * k] = new_ids[#new_ids + 1 - k]
end
bulk('ZADD', inflight, lease_args, 2)
-- Each user's new count, and each capped user's horizon, in one write after `inflight`'s: the
-- count is the user's ids in `inflight` (includes/leave_lease.lua takes them off).
local user_args = {}
for k = 1, #gained do
  local user = gained[k]
  user_args[#user_args + 1] = user
  user_args[#user_args + 1] = string.format('%d', held[user])
end
for user, at in pairs(horizon) do
  user_args[#user_args + 1] = '~' .. user
  user_args[#user_args + 1] = string.format('%.3f', at)
end
bulk('HSET', leases_of, user_args, 2)
bulk('ZREM', due, drop, 1)
bulk('ZADD', due, defer_args, 2)
out[2] = #defer_args / 2
return out
