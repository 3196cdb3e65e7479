-- claim_due.lua — move due contexts whose deadline passed into `inflight` with a lease.
--
-- One round trip: the script reads its candidates itself (ZRANGEBYSCORE due -inf now LIMIT 0 n)
-- and names each candidate's hash from the prefix it is given, so the caller sends 6 keys and 7
-- arguments instead of two keys and an id per candidate after a read of its own (bench P2: the
-- read's round trip and the 300 packed arguments were ~0.6 ms of a 1.9 ms claim). The hashes it
-- names are its shard's: the prefix carries the shard's hash tag, so on a cluster they sit in
-- the slot of KEYS[1] (a script may touch undeclared keys of its own slot; tests/test_cluster.py
-- claims through a real cluster). The read and the checks are one atomic step, so two tickers
-- racing never claim one context twice.
--
-- KEYS[1]  due        zset  context id -> deadline (epoch ms)
-- KEYS[2]  inflight   zset  context id -> lease expiry (epoch ms)
-- KEYS[3]  epoch      string  the shard's claim counter: each claim token is its next value,
--                             and at least ARGV[1] * 1000 (see reserve_tokens)
-- KEYS[4]  batch:pending  zset  context id -> time parked (a claim supersedes a parked run)
-- KEYS[5]  batch:out  zset  context id -> time past which its job counts as lost (likewise)
-- KEYS[6]  uleases    hash  user part -> the user's ids in `inflight`; `~<user part>` -> the
--                           user's deferral horizon (includes/leave_lease.lua)
--
-- ARGV[1]  now_ms         current time, epoch milliseconds
-- ARGV[2]  lease_ms       how long a claim holds the context, milliseconds; also how far past
--                         now a capped user's deferral horizon may go
-- ARGV[3]  max_inflight   stop claiming when `inflight` holds this many ids (count)
-- ARGV[4]  user_cap       a user holding this many live leases gets no more claims (count)
-- ARGV[5]  defer_ms       a capped candidate's place in `due` moves to now + defer_ms at the
--                         earliest (ms; one tick), see "Bulk skip" below
-- ARGV[6]  limit          examine at most this many due candidates (count)
-- ARGV[7]  ctx_prefix     a candidate's hash is ctx_prefix .. id (`ctx:<id>`)
--
-- Returns {status, deferred, first_token, examined, id_1, version_1, id_2, version_2, ...}, where
--   status   1  every candidate was examined
--            2  stopped early: `inflight` is full (backpressure)
--   deferred    how many due candidates were left in `due` because their user was at user_cap
--   first_token the claim token of id_1; id_k's is first_token + k - 1 (one INCRBY reserved them
--               in order), so the tokens are not repeated in the reply; 0 when none was claimed
--   examined    how many due candidates the range read found (0: nothing is due)
-- A candidate whose hash vanished is removed from `due` (celery-redbeat's cleanup); one already in
-- flight is removed from `due` too (its complete reschedules it from deadline_ms), and so is one
-- parked for or out in a batch job (`batch_token` set) unless it is `urgent` (a flush).
-- A claim sets `claimed_sync` to "1" when the run is urgent, or sent back by a failed batch
-- (absent otherwise), and clears `urgent` and `batch_fallback`; a claim of a context in the
-- batch lane takes it out of the lane (includes/leave_batch_lane.lua), so the batch's answer is
-- fenced off. It also closes the
-- debounce window: `pending_since_ms` and `deadline_ms` are set to '' in the same HSET as the
-- claim's own fields (one write, not a write and a delete). Every reader takes both as numbers
-- (enqueue, complete, fail, release, batch_complete), so '' reads as absent: the next enqueue
-- opens a fresh window.
--
-- Calls per claimed candidate: HMGET and HSET of its hash (plus an HDEL of `urgent`/
-- `batch_fallback` when one of them is set, and the lane's three calls for a context in the
-- batch lane). The rest is per call: the range read, a ZMSCORE of `inflight` and an HMGET of
-- the users' lease counts check every candidate at once, one INCRBY reserves every token the
-- call hands out, one HSET writes every user's new count, and the bulk ZADD and ZREM move the
-- ids. A claim of 100 due contexts of 100 users is 207 calls (bench P2 counts them with INFO
-- commandstats). The counts live in one hash per shard, not a zset per user: a key created and
-- deleted per user and claim (a user's first lease, then its last complete) cost ~0.4 ms of a
-- claim of 100 among a million keys (docs/benchmarks.md, "Issue 33's P2, third round"). Two
-- calls per candidate, its hash read and written, are the floor while the claim's fields live
-- in the context's hash.
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
-- claimed id is in `inflight` before it leaves `due`: a failure can never leave it in no set.

--- @include "includes/leave_batch_lane"
--- @include "includes/user_part"

local due, inflight, epoch, pending, batched = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]

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
local users = {}
for i = 1, n do users[i] = user_part(ids[i]) end
local counts = read_each('HMGET', leases_of, users)  -- each candidate's user's live leases
local count = redis.call('ZCARD', inflight)
local count_before = count
local SMALL_ZSET = 128
local held = {}  -- user part -> live leases, as this call moves them
local gained, gained_set = {}, {}  -- the user parts this call gave a lease, each once
-- Each claimed candidate's hash and its HMGET reply, in claim order (two flat lists, not a
-- table per claim).
local claimed_ctx, claimed_fields = {}, {}
local drop, new_ids, lease_args, defer_args = {}, {}, {}, {}

for i = 1, n do
  local id, user = ids[i], users[i]
  if leases[i] then
    -- In flight already: its complete reschedules it from deadline_ms (no read of its hash).
    drop[#drop + 1] = id
  else
    local ctx = ctx_prefix .. id
    -- `version` is set by every enqueue, so its absence means the hash vanished.
    local fields = redis.call('HMGET', ctx, 'version', 'batch_token', 'urgent', 'batch_fallback')
    if not fields[1] then
      drop[#drop + 1] = id
    elseif fields[2] and not fields[3] then
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
        claimed_ctx[#claimed_ctx + 1] = ctx
        claimed_fields[#claimed_fields + 1] = fields
      end
      held[user] = user_held
    end
  end
end
if #claimed_ctx > 0 then
  -- The shard's counter never goes back, even when a hash is deleted and re-created, so a
  -- token is unique and a newer claim of a context always has a larger one: the storage
  -- fences saves with it (a run from an earlier claim can never match, nor outrank).
  local first = reserve_tokens(#claimed_ctx)
  out[3] = string.format('%d', first)
  for k = 1, #claimed_ctx do
    local ctx, fields, id = claimed_ctx[k], claimed_fields[k], new_ids[k]  -- not sorted yet
    local version = fields[1]
    -- claimed_sync: this run calls the model itself, never through the batch lane (a flush or
    -- an over-size context, or a batch that failed it).
    local flagged = fields[3] or fields[4]
    -- One write: the claim's fields, and the window it takes cleared in place ('' reads as
    -- absent), so the next enqueue starts a fresh debounce window: it must not inherit this
    -- run's past deadline (which would make it due at once) nor its max-delay start.
    -- `claimed_sync` is written only when set: every claim ends through release_claim, which
    -- clears it (a field per candidate fewer in the common claim).
    local token = string.format('%d', first + k - 1)
    if flagged then
      redis.call('HSET', ctx, 'claim_token', token, 'claimed_version', version,
        'pending_since_ms', '', 'deadline_ms', '', 'claimed_sync', '1')
      redis.call('HDEL', ctx, 'urgent', 'batch_fallback')  -- handed to this run
    else
      redis.call('HSET', ctx, 'claim_token', token, 'claimed_version', version,
        'pending_since_ms', '', 'deadline_ms', '')
    end
    if fields[2] then
      leave_batch_lane(ctx, pending, batched, id)  -- superseded by this claim
    end
    out[#out + 1] = id
    out[#out + 1] = version
  end
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
