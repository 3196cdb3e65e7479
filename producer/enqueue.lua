-- enqueue.lua — add the messages of one context to what it holds pending and (re)schedule it,
-- atomically.
--
-- KEYS[1]  ctx:<id>   hash of the context (fields: docs/architecture.md, the Redis contract)
-- KEYS[2]  due        zset  context id -> deadline (epoch ms)
-- KEYS[3]  inflight   zset  context id -> lease expiry (epoch ms)
-- KEYS[4]  dead       zset  context id -> time it died (epoch ms)
-- KEYS[5]  uctx:<user>  set  the user's context ids in this shard (found by erasure)
--
-- ARGV[1]  now_ms          current time, epoch milliseconds
-- ARGV[2]  debounce_ms     quiet period after the latest enqueue, milliseconds
-- ARGV[3]  max_delay_ms    cap counted from pending_since_ms, milliseconds
-- ARGV[4]  flush           "1": due now (zero delay); "0": debounced
-- ARGV[5]  messages_json   JSON list of filtered messages, merged with the stored list (below):
--                          {"role", "content", "id"?, "at"?} — `at` when the message was said,
--                          epoch ms (kept as sent; the merge never reads it)
-- ARGV[6]  thread_id
-- ARGV[7]  user_id
-- ARGV[8]  agent_name      "" for the user-global memory
-- ARGV[9]  trace_id        "" when none; replaced together with captured_ms
-- ARGV[10] context_id      the member name in due / inflight / dead
-- ARGV[11] captured_ms     when the agent handed these messages over, epoch milliseconds
--                          (absent or "": now_ms). A spool replay or another replica can deliver
--                          an older capture after a newer one: then the stored list is the newer
--                          view and the older one only adds what it lacks; trace id and
--                          captured_ms stay, while version and deadline still apply.
-- ARGV[12] retention_ms    time to live of KEYS[1] and KEYS[5] from this enqueue, milliseconds:
--                          a context nobody extracts (no worker for that long) does not keep the
--                          user's text forever
-- ARGV[13] pending_max_bytes  when the merged messages JSON is longer than this (bytes), the
--                          context is due now instead of debounced (absent or "": no cap)
-- ARGV[14] context_max_bytes  hard cap of the stored messages JSON (bytes; absent or "": none).
--                          Checked on both lists before anything is decoded, and on the merge:
--                          past it the oldest messages are cut at an element boundary (found by
--                          string search, never by decoding), so a runaway context costs every
--                          later call at most this much work. What is cut is counted on the hash
--                          (`cut_messages`, `cut_bytes`), for the worker to report
--
-- Messages accumulate until a worker extracts them: the later-captured list is the agent's view
-- and is kept whole, in its order; a message of the other list it does not hold (same id, else
-- same role and content) is kept too, in its order — before that list when some later message of
-- the other one is in it, else right after the last one that is. So a summarised, truncated or
-- edited history never drops what was handed over and not yet extracted. Nothing is decoded in
-- the common cases, on lists as the producer encodes them: the new list starts with the stored
-- one (the agent appended a turn), or with its end from the first stored message after the head
-- equal to the new list's first (the size cap dropped the front, or the turn after a merge):
-- then the stored front is kept before it whole.
--
-- A flush, or a context over pending_max_bytes, also sets the hash's `urgent` field: urgent work
-- never waits in the batch lane (claim_due hands the mark to the run as `claimed_sync`).
--
-- Returns {version, deadline_ms, code, cut}
--   code 1  scheduled: due holds the context at deadline_ms
--   code 2  deferred in flight: a worker holds the context; its complete reschedules it from
--           the stored deadline_ms, so due is left alone (never two runs of one context at once)
--   cut     how many messages this call cut to keep within ARGV[14] (0 almost always)

local ctx, due, inflight, dead, users = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local now = tonumber(ARGV[1])
local id = ARGV[10]

-- Whether the encoded list `newer` starts with every message of the encoded list `older`.
local function extends(older, newer)
  if older == newer then return true end
  local n = #older
  if n >= #newer or string.sub(older, n) ~= ']' then return false end
  return string.sub(newer, 1, n - 1) == string.sub(older, 1, n - 1)
    and string.sub(newer, n, n) == ','
end

-- When `newer` starts with the end of `older`, from the first element after the head equal to
-- newer's first, the elements of `older` before it (encoded, without brackets); else nil. An
-- element starts with {"role":" in the producer's encoding, and that sequence (bare quotes) can
-- never occur inside a JSON string, so it marks element boundaries.
local function front_before(older, newer)
  if #newer < 3 or #older < 3 then return nil end
  local e = string.find(newer, '},{"role":"', 2, true)
  local first = e and string.sub(newer, 2, e) or string.sub(newer, 2, -2)
  local at = string.find(older, ',' .. first, 2, true)
  if not at then return nil end
  local rest = string.sub(older, at + 1, -2)
  if string.sub(newer, 2, #rest + 1) ~= rest then return nil end
  local after = string.sub(newer, #rest + 2, #rest + 2)
  if after ~= ',' and after ~= ']' then return nil end
  return string.sub(older, 2, at - 1)
end

local function identity(m)
  if type(m) ~= 'table' then return 'x\0' .. tostring(m) end
  if type(m.id) == 'string' and m.id ~= '' then return 'i\0' .. m.id end
  return 'c\0' .. tostring(m.role) .. '\0' .. tostring(m.content)
end

-- The encoded elements of a list in the producer's encoding (nil for any other): split at the
-- boundaries front_before relies on, so a merge can be written back in that same encoding and
-- the next turn's hand-off still finds the stored list without decoding.
local function elements(list)
  if list == '[]' then return {} end
  if string.sub(list, 1, 10) ~= '[{"role":"' then return nil end
  local out, from = {}, 2
  while true do
    local e = string.find(list, '},{"role":"', from, true)
    if not e then
      out[#out + 1] = string.sub(list, from, -2)
      return out
    end
    out[#out + 1] = string.sub(list, from, e)
    from = e + 2
  end
end

-- `newer` plus the messages of `older` it does not hold (the rule in the header); both encoded.
local function merge(older, newer)
  if not older or older == '[]' or extends(older, newer) then return newer end
  local front = front_before(older, newer)
  if front then return '[' .. front .. ',' .. string.sub(newer, 2) end
  local ok_old, old_list = pcall(cjson.decode, older)
  local ok_new, new_list = pcall(cjson.decode, newer)
  if not (ok_old and ok_new and type(old_list) == 'table' and type(new_list) == 'table') then
    return newer
  end
  local held, first_at = {}, {}
  for i, m in ipairs(new_list) do
    local key = identity(m)
    held[key] = true
    if not first_at[key] then first_at[key] = i end
  end
  local last_held = 0
  for i = #old_list, 1, -1 do
    if held[identity(old_list[i])] then last_held = i break end
  end
  -- The merged list as picks: {from old list?, index}.
  local picks = {}
  local function take(from_old, first, last)
    for i = first, last do picks[#picks + 1] = {from_old, i} end
  end
  if last_held == 0 then
    take(true, 1, #old_list)
    take(false, 1, #new_list)
  else
    for i = 1, last_held - 1 do
      if not held[identity(old_list[i])] then picks[#picks + 1] = {true, i} end
    end
    if #picks == 0 and last_held == #old_list then return newer end
    local at = first_at[identity(old_list[last_held])]
    take(false, 1, at)
    take(true, last_held + 1, #old_list)
    take(false, at + 1, #new_list)
  end
  local old_parts, new_parts = elements(older), elements(newer)
  local out = {}
  if old_parts and new_parts and #old_parts == #old_list and #new_parts == #new_list then
    for i, pick in ipairs(picks) do
      out[i] = pick[1] and old_parts[pick[2]] or new_parts[pick[2]]
    end
    return '[' .. table.concat(out, ',') .. ']'
  end
  for i, pick in ipairs(picks) do
    out[i] = pick[1] and old_list[pick[2]] or new_list[pick[2]]
  end
  return cjson.encode(out)
end

-- The newest elements of the encoded list `list` within `limit` bytes, without decoding: the
-- first element boundary (the marker front_before relies on) far enough from the end. A list in
-- another encoding, or whose newest element alone is too long, is cut whole. Returns the list,
-- how many messages were cut (each has one bare "role": key, which no JSON string can hold) and
-- how many bytes.
local function newest_within(list, limit)
  if not list or not limit or #list <= limit then return list, 0, 0 end
  local at
  if string.sub(list, 1, 10) == '[{"role":"' then
    at = string.find(list, '},{"role":"', math.max(2, #list - limit), true)
  end
  local kept = at and ('[' .. string.sub(list, at + 2)) or '[]'
  local removed = at and string.sub(list, 1, at) or list
  local count, from = 0, 1
  while true do
    local found = string.find(removed, '"role":', from, true)
    if not found then break end
    count, from = count + 1, found + 7
  end
  return kept, count, #list - #kept
end

-- One read and one write of the hash: this runs on every agent turn.
local stored = redis.call('HMGET', ctx, 'pending_since_ms', 'deadline_ms', 'first_enqueued_ms',
  'captured_ms', 'messages', 'version', 'dead_at_ms')
-- The version is bumped in the same write (nothing else runs between the read and the write).
local version = (tonumber(stored[6]) or 0) + 1
local fields = {'last_enqueued_ms', ARGV[1], 'version', string.format('%d', version)}
local n = 4
if not stored[6] then
  -- Who the context is: written with its first version (only this script writes either), not
  -- rewritten on every turn.
  fields[5], fields[6], fields[7], fields[8] = 'thread_id', ARGV[6], 'user_id', ARGV[7]
  fields[9], fields[10] = 'agent_name', ARGV[8]
  n = 10
end

-- The later capture is the agent's current view; a tie is a re-send. Captured the same
-- millisecond as sent (the common call) needs no conversion.
local captured = now
if ARGV[11] ~= ARGV[1] then captured = tonumber(ARGV[11]) or now end
local stored_captured = tonumber(stored[4])
local limit = tonumber(ARGV[14])
local held_list, cut_held, cut_held_bytes = newest_within(stored[5], limit)
local handed, cut_handed, cut_handed_bytes = newest_within(ARGV[5], limit)
local messages
if not stored_captured or captured >= stored_captured then
  messages = merge(held_list, handed)
  fields[n + 1], fields[n + 2] = 'trace_id', ARGV[9]
  fields[n + 3], fields[n + 4] = 'captured_ms', captured == now and ARGV[1] or string.format('%d', captured)
  n = n + 4
else
  messages = merge(handed, held_list or handed)
end
local cut_merged, cut_merged_bytes
messages, cut_merged, cut_merged_bytes = newest_within(messages, limit)
local cut = cut_held + cut_handed + cut_merged
local cut_bytes = cut_held_bytes + cut_handed_bytes + cut_merged_bytes
if messages ~= stored[5] then
  fields[n + 1], fields[n + 2] = 'messages', messages
  n = n + 2
end

-- Read as numbers: a claim leaves both fields '' (no window open), which reads as absent.
local pending_since = tonumber(stored[1])
if not pending_since then
  pending_since = now
  fields[n + 1], fields[n + 2] = 'pending_since_ms', ARGV[1]
  n = n + 2
end

local deadline
local max_bytes = tonumber(ARGV[13])
if ARGV[4] == '1' or (max_bytes and #messages > max_bytes) then
  -- Too much pending text to wait for more: due now rather than cut (the worker splits it).
  deadline = now
  -- Urgent work (a flush, an over-size context) never waits in the batch lane; claim_due hands
  -- the mark to the run and clears it.
  fields[n + 1], fields[n + 2] = 'urgent', '1'
  n = n + 2
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
redis.call('HSET', ctx, unpack(fields))
if cut_bytes > 0 then
  redis.call('HINCRBY', ctx, 'cut_messages', cut)
  redis.call('HINCRBY', ctx, 'cut_bytes', cut_bytes)
end
redis.call('PEXPIRE', ctx, ARGV[12])
redis.call('SADD', users, id)
redis.call('PEXPIRE', users, ARGV[12])

-- New messages deserve a new try: a dead context comes back with its attempts reset. Only a
-- hash marked dead, or one that was gone (a dead letter's hash expires before its id is reaped),
-- can have an id in `dead`: an ordinary turn does not look.
if (stored[7] or not stored[5]) and redis.call('ZREM', dead, id) == 1 then
  redis.call('HSET', ctx, 'attempts', '0')
  redis.call('HDEL', ctx, 'dead_at_ms')
end

if redis.call('ZSCORE', inflight, id) then
  return {version, deadline, 2, cut}
end
redis.call('ZADD', due, deadline_str, id)
return {version, deadline, 1, cut}
