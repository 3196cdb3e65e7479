-- rate_acquire.lua — take one request and its tokens from the shared LLM rate limit, or say when
-- they will fit. Every worker process of every host calls it on the same hash, so the limit holds
-- for all of them together.
--
-- The schedule is GCRA (the generic cell rate algorithm): for each of requests and tokens, `*_tat`
-- is the theoretical arrival time of the next unit; a call is admitted when taking its cost keeps
-- that time within the burst tolerance of now. Same result as a refilling bucket, one number of
-- state per limit. Requests and tokens are admitted together or not at all.
--
-- KEYS[1]  rate:{<scope>}  hash: req_tat, tok_tat (epoch ms, fractional), paused_until (epoch ms)
--
-- ARGV[1]  now_ms            current time, epoch milliseconds
-- ARGV[2]  request_ms        milliseconds per request (60000 / RPM); "0" = no request limit
-- ARGV[3]  request_burst_ms  burst tolerance of the request schedule, milliseconds
-- ARGV[4]  token_ms          milliseconds per token (60000 / TPM); "0" = no token limit
-- ARGV[5]  token_burst_ms    burst tolerance of the token schedule, milliseconds
-- ARGV[6]  tokens            the call's token estimate (count)
-- ARGV[7]  reserve           "1": when the call does not fit now, take its slot anyway (the run
--                            comes back then and calls without asking again); "0": take nothing
--
-- Returns {code, at_ms}
--   {1, now_ms}   admitted: the request and its tokens are taken
--   {0, at_ms}    not admitted: the earliest time (epoch ms) both would fit; nothing is taken
--   {2, at_ms}    not admitted: the provider asked for a pause until at_ms; nothing is taken
--   {3, at_ms}    reserved: the request and its tokens are taken for the slot at at_ms

local key = KEYS[1]
local now = tonumber(ARGV[1])
local req_ms, req_burst = tonumber(ARGV[2]), tonumber(ARGV[3])
local tok_ms, tok_burst = tonumber(ARGV[4]), tonumber(ARGV[5])
local tokens = tonumber(ARGV[6])

local f = redis.call('HMGET', key, 'req_tat', 'tok_tat', 'paused_until')
local paused = tonumber(f[3]) or 0
if paused > now then
  return {2, string.format('%d', paused)}
end

-- One schedule: the new arrival time after `cost` units, and the earliest time it is allowed.
local function schedule(tat, per_unit, burst, cost)
  local new_tat = math.max(tonumber(tat) or now, now) + cost * per_unit
  return new_tat, new_tat - burst
end

local at = now
local req_tat, tok_tat
if req_ms > 0 then
  local allowed_at
  req_tat, allowed_at = schedule(f[1], req_ms, req_burst, 1)
  at = math.max(at, allowed_at)
end
if tok_ms > 0 then
  -- A call larger than the whole burst could never fit: it is charged the burst, not refused.
  local cost = math.min(tokens, tok_burst / tok_ms)
  local allowed_at
  tok_tat, allowed_at = schedule(f[2], tok_ms, tok_burst, cost)
  at = math.max(at, allowed_at)
end
local code = 1
if at > now then
  if ARGV[7] ~= '1' then
    return {0, string.format('%d', math.ceil(at))}
  end
  code = 3
end
local horizon = now
if req_tat then
  redis.call('HSET', key, 'req_tat', string.format('%.3f', req_tat))
  horizon = math.max(horizon, req_tat)
end
if tok_tat then
  redis.call('HSET', key, 'tok_tat', string.format('%.3f', tok_tat))
  horizon = math.max(horizon, tok_tat)
end
-- Past its schedule the hash means nothing: let it go.
redis.call('PEXPIRE', key, math.ceil(horizon - now) + 60000)
return {code, string.format('%d', math.ceil(at))}
