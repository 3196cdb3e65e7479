-- enqueue.lua — record the latest messages of one context and (re)schedule it, atomically.
--
-- KEYS[1]  ctx:<id>   hash of the context (fields: see DESIGN.md / the Redis contract)
-- KEYS[2]  due        zset  context id -> deadline (epoch ms)
-- KEYS[3]  inflight   zset  context id -> lease expiry (epoch ms)
-- KEYS[4]  dead       zset  context id -> time it died (epoch ms)
-- KEYS[5]  uctx:<user>  set  the user's context ids in this shard (found by erasure)
--
-- ARGV[1]  now_ms          current time, epoch milliseconds
-- ARGV[2]  debounce_ms     quiet period after the latest enqueue, milliseconds
-- ARGV[3]  max_delay_ms    cap counted from pending_since_ms, milliseconds
-- ARGV[4]  flush           "1": due now (zero delay); "0": debounced
-- ARGV[5]  messages_json   JSON list of filtered messages; replaces the stored list unless the
--                          stored one was captured later (see ARGV[13])
-- ARGV[6]  correction      "0"/"1", OR-merged into the stored flag
-- ARGV[7]  reinforcement   "0"/"1", OR-merged into the stored flag
-- ARGV[8]  thread_id
-- ARGV[9]  user_id
-- ARGV[10] agent_name      "" for the user-global memory
-- ARGV[11] trace_id        "" when none; replaced together with the messages
-- ARGV[12] context_id      the member name in due / inflight / dead
-- ARGV[13] captured_ms     when the agent handed these messages over, epoch milliseconds
--                          (absent or "": now_ms). A spool replay or another replica can deliver
--                          an older capture after a newer one: then the stored messages, trace id
--                          and captured_ms stay, while flags, version and deadline still apply.
-- ARGV[14] retention_ms    time to live of KEYS[1] and KEYS[5] from this enqueue, milliseconds:
--                          a context nobody extracts (no worker for that long) does not keep the
--                          user's text forever
--
-- Returns {version, deadline_ms, code}
--   code 1  scheduled: due holds the context at deadline_ms
--   code 2  deferred in flight: a worker holds the context; its complete reschedules it from
--           the stored deadline_ms, so due is left alone (never two runs of one context at once)

local ctx, due, inflight, dead, users = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now = tonumber(ARGV[1])
local id = ARGV[12]

-- One read and one write of the hash: this runs on every agent turn.
local stored = redis.call('HMGET', ctx, 'pending_since_ms', 'deadline_ms', 'first_enqueued_ms',
  'flush', 'correction', 'reinforcement', 'captured_ms')
local fields = {'thread_id', ARGV[8], 'user_id', ARGV[9], 'agent_name', ARGV[10],
  'last_enqueued_ms', ARGV[1]}
local n = #fields

-- Never replace newer messages with older ones (a version would be lost); a tie is a re-send.
local captured = tonumber(ARGV[13]) or now
local stored_captured = tonumber(stored[7])
if not stored_captured or captured >= stored_captured then
  fields[n + 1], fields[n + 2] = 'messages', ARGV[5]
  fields[n + 3], fields[n + 4] = 'trace_id', ARGV[11]
  fields[n + 5], fields[n + 6] = 'captured_ms', string.format('%d', captured)
  n = n + 6
end

local pending_since = tonumber(stored[1])
if not pending_since then
  pending_since = now
  fields[n + 1], fields[n + 2] = 'pending_since_ms', ARGV[1]
  n = n + 2
end

local deadline
if ARGV[4] == '1' then
  deadline = now
else
  deadline = math.min(now + tonumber(ARGV[2]), pending_since + tonumber(ARGV[3]))
end
-- An already-due key is never pushed back by a later enqueue (a flush stays a flush).
local stored_deadline = tonumber(stored[2])
if stored_deadline and stored_deadline <= now then
  deadline = stored_deadline
end
local deadline_str = string.format('%d', deadline)
fields[n + 1], fields[n + 2] = 'deadline_ms', deadline_str
n = n + 2

if not stored[3] then
  fields[n + 1], fields[n + 2] = 'first_enqueued_ms', ARGV[1]
  n = n + 2
end
-- Flags are OR-merged: a "1" overwrites, a "0" only fills a missing field.
local flags = {{'flush', ARGV[4], stored[4]}, {'correction', ARGV[6], stored[5]},
  {'reinforcement', ARGV[7], stored[6]}}
for _, flag in ipairs(flags) do
  if flag[2] == '1' then
    fields[n + 1], fields[n + 2] = flag[1], '1'
    n = n + 2
  elseif not flag[3] then
    fields[n + 1], fields[n + 2] = flag[1], '0'
    n = n + 2
  end
end
redis.call('HSET', ctx, unpack(fields))
local version = redis.call('HINCRBY', ctx, 'version', 1)
redis.call('PEXPIRE', ctx, ARGV[14])
redis.call('SADD', users, id)
redis.call('PEXPIRE', users, ARGV[14])

-- New messages deserve a new try: a dead context comes back with its attempts reset.
if redis.call('ZREM', dead, id) == 1 then
  redis.call('HSET', ctx, 'attempts', '0')
  redis.call('HDEL', ctx, 'dead_at_ms')
end

if redis.call('ZSCORE', inflight, id) then
  return {version, deadline, 2}
end
redis.call('ZADD', due, deadline_str, id)
return {version, deadline, 1}
