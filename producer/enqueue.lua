-- enqueue.lua — record the latest messages of one context and (re)schedule it, atomically.
--
-- KEYS[1]  ctx:<id>   hash of the context (fields: see DESIGN.md / the Redis contract)
-- KEYS[2]  due        zset  context id -> deadline (epoch ms)
-- KEYS[3]  inflight   zset  context id -> lease expiry (epoch ms)
-- KEYS[4]  dead       zset  context id -> time it died (epoch ms)
--
-- ARGV[1]  now_ms          current time, epoch milliseconds
-- ARGV[2]  debounce_ms     quiet period after the latest enqueue, milliseconds
-- ARGV[3]  max_delay_ms    cap counted from pending_since_ms, milliseconds
-- ARGV[4]  flush           "1": due now (zero delay); "0": debounced
-- ARGV[5]  messages_json   JSON list of filtered messages; replaces the stored list
-- ARGV[6]  correction      "0"/"1", OR-merged into the stored flag
-- ARGV[7]  reinforcement   "0"/"1", OR-merged into the stored flag
-- ARGV[8]  thread_id
-- ARGV[9]  user_id
-- ARGV[10] agent_name      "" for the user-global memory
-- ARGV[11] trace_id        "" when none
-- ARGV[12] context_id      the member name in due / inflight / dead
--
-- Returns {version, deadline_ms, code}
--   code 1  scheduled: due holds the context at deadline_ms
--   code 2  deferred in flight: a worker holds the context; its complete reschedules it from
--           the stored deadline_ms, so due is left alone (never two runs of one context at once)

local ctx, due, inflight, dead = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local now = tonumber(ARGV[1])
local id = ARGV[12]

local pending_since = tonumber(redis.call('HGET', ctx, 'pending_since_ms'))
if not pending_since then
  pending_since = now
  redis.call('HSET', ctx, 'pending_since_ms', ARGV[1])
end

local deadline
if ARGV[4] == '1' then
  deadline = now
else
  deadline = math.min(now + tonumber(ARGV[2]), pending_since + tonumber(ARGV[3]))
end
-- An already-due key is never pushed back by a later enqueue (a flush stays a flush).
local stored = tonumber(redis.call('HGET', ctx, 'deadline_ms'))
if stored and stored <= now then
  deadline = stored
end
local deadline_str = string.format('%d', deadline)

redis.call('HSETNX', ctx, 'first_enqueued_ms', ARGV[1])
redis.call('HSET', ctx,
  'thread_id', ARGV[8], 'user_id', ARGV[9], 'agent_name', ARGV[10], 'trace_id', ARGV[11],
  'messages', ARGV[5], 'last_enqueued_ms', ARGV[1], 'deadline_ms', deadline_str)
-- Flags are OR-merged: a "1" overwrites, a "0" only fills a missing field.
local flags = {flush = ARGV[4], correction = ARGV[6], reinforcement = ARGV[7]}
for field, value in pairs(flags) do
  if value == '1' then
    redis.call('HSET', ctx, field, '1')
  else
    redis.call('HSETNX', ctx, field, '0')
  end
end
local version = redis.call('HINCRBY', ctx, 'version', 1)

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
