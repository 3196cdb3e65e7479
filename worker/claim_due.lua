-- claim_due.lua — move due contexts whose deadline passed into `inflight` with a lease.
--
-- The caller reads candidates with ZRANGEBYSCORE due -inf now LIMIT 0 n and passes them here; each
-- one is re-checked, so two tickers racing on the same candidates never claim one twice.
--
-- KEYS[1]    due        zset  context id -> deadline (epoch ms)
-- KEYS[2]    inflight   zset  context id -> lease expiry (epoch ms)
-- KEYS[2+i]  ctx:<id>   hash of candidate i (i = 1..n)
--
-- ARGV[1]    now_ms         current time, epoch milliseconds
-- ARGV[2]    lease_ms       how long a claim holds the context, milliseconds
-- ARGV[3]    max_inflight   stop claiming when `inflight` holds this many ids (count)
-- ARGV[3+i]  context id of candidate i
--
-- Returns {status, id_1, token_1, version_1, id_2, ...} for every context claimed, where status is
--   1  every candidate was examined
--   2  stopped early: `inflight` is full (backpressure)
-- A candidate whose hash vanished is removed from `due` (celery-redbeat's cleanup); one already in
-- flight is removed from `due` too (its complete reschedules it from deadline_ms).

local due, inflight = KEYS[1], KEYS[2]
local now = tonumber(ARGV[1])
local lease_until = string.format('%d', now + tonumber(ARGV[2]))
local cap = tonumber(ARGV[3])
local count = redis.call('ZCARD', inflight)
local out = {1}
local n = #KEYS - 2
if n == 0 then return out end

-- Two batched reads instead of two reads per candidate (ZMSCORE needs Redis 6.2, our floor).
local ids = {}
for i = 1, n do ids[i] = ARGV[3 + i] end
local deadlines = redis.call('ZMSCORE', due, unpack(ids))
local leases = redis.call('ZMSCORE', inflight, unpack(ids))
local drop, lease_args = {}, {}

for i = 1, n do
  local ctx, id = KEYS[2 + i], ids[i]
  local deadline = tonumber(deadlines[i])
  if deadline and deadline <= now then
    -- `version` is set by every enqueue, so its absence means the hash vanished.
    local fields = redis.call('HMGET', ctx, 'version', 'claims')
    if not fields[1] then
      drop[#drop + 1] = id
    elseif leases[i] then
      drop[#drop + 1] = id
    elseif count >= cap then
      out[1] = 2
      break
    else
      drop[#drop + 1] = id
      lease_args[#lease_args + 1] = lease_until
      lease_args[#lease_args + 1] = id
      count = count + 1
      -- The counter makes tokens unique per hash; the time makes them unique across a hash that
      -- was deleted and re-created, so a worker from an earlier life can never match.
      local claims = (tonumber(fields[2]) or 0) + 1
      local token = claims .. '-' .. ARGV[1]
      local version = fields[1]
      redis.call('HSET', ctx, 'claims', claims, 'claim_token', token, 'claimed_version', version,
        'claimed_at_ms', ARGV[1])
      -- The next enqueue starts a fresh debounce window: it must not inherit this run's past
      -- deadline (which would make it due at once) nor its max-delay start.
      redis.call('HDEL', ctx, 'pending_since_ms', 'deadline_ms')
      out[#out + 1] = id
      out[#out + 1] = token
      out[#out + 1] = version
    end
  end
end
if #drop > 0 then redis.call('ZREM', due, unpack(drop)) end
if #lease_args > 0 then redis.call('ZADD', inflight, unpack(lease_args)) end
return out
