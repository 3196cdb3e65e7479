-- dead_letter — move a context to `dead`, with the time it died and a time to live.
--
-- The hash (which holds the user's text) expires `retention_ms` after it died, so a dead letter
-- nobody retries or purges does not keep that text forever.
--
--   ctx           ctx:<id> hash of the context
--   dead          zset  context id -> time it died (epoch ms)
--   id            context id
--   now_ms        epoch milliseconds, the time it died (string)
--   retention_ms  milliseconds the hash lives on (string)
local function dead_letter(ctx, dead, id, now_ms, retention_ms)
  redis.call('HSET', ctx, 'dead_at_ms', now_ms)
  redis.call('PEXPIRE', ctx, retention_ms)
  redis.call('ZADD', dead, now_ms, id)
end
