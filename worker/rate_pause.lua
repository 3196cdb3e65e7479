-- rate_pause.lua — the provider said to wait (a 429's Retry-After, or no requests left until its
-- reset): no call is admitted before `until_ms`. A shorter pause never cuts a longer one short.
--
-- KEYS[1]  rate:{<scope>}  hash of the shared LLM rate limit (see rate_acquire.lua)
--
-- ARGV[1]  until_ms  epoch milliseconds before which rate_acquire admits nothing
-- ARGV[2]  now_ms    current time, epoch milliseconds
--
-- Returns the pause in force afterwards (epoch ms).

local key = KEYS[1]
local until_ms = tonumber(ARGV[1])
local current = tonumber(redis.call('HGET', key, 'paused_until')) or 0
if until_ms > current then
  redis.call('HSET', key, 'paused_until', string.format('%d', until_ms))
  local ttl = redis.call('PTTL', key)
  local needed = until_ms - tonumber(ARGV[2]) + 60000
  if ttl < needed then
    redis.call('PEXPIRE', key, needed)
  end
  current = until_ms
end
return string.format('%d', current)
