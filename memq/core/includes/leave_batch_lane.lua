-- leave_batch_lane — take a context out of the batch lane: the batch fields of its hash go
-- (`batch_token`, the request, its watermark and run, the job's id, the time it was parked),
-- and its id leaves `batch:pending` and `batch:out`. The fields are named here and set only by
-- batch_park.lua (and `batch_id` by batch_submit.lua): every other script leaves the lane
-- through this function, so a claim of a context that was never parked touches none of them.
-- The job's own record (batch:job:<id>) keeps the request until the job is settled.
--
--   ctx      ctx:<id> hash of the context (HDEL on a deleted hash does nothing)
--   pending  zset  batch:pending, context id -> time parked (epoch ms)
--   out      zset  batch:out, context id -> time past which its job counts as lost (epoch ms)
--   id       context id
local function leave_batch_lane(ctx, pending, out, id)
  redis.call('HDEL', ctx, 'batch_token', 'batch_request', 'batch_watermark', 'batch_run',
    'batch_id', 'batch_parked_ms')
  redis.call('ZREM', pending, id)
  redis.call('ZREM', out, id)
end
