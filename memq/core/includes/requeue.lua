-- requeue — make a context due again at `deadline_ms`.
--
-- The hash's deadline_ms and the id's score in `due` are written together, so they agree: the
-- score is when the ticker claims it, deadline_ms what a later enqueue or complete keeps.
--
--   ctx          ctx:<id> hash of the context
--   due          zset  context id -> deadline (epoch ms)
--   id           context id
--   deadline_ms  epoch milliseconds (string or number)
local function requeue(ctx, due, id, deadline_ms)
  redis.call('HSET', ctx, 'deadline_ms', deadline_ms)
  redis.call('ZADD', due, deadline_ms, id)
end
