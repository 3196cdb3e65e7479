-- leave_lease — take a context out of the lease's sets: `inflight` and its user's in-flight set
-- (the per-user cap). The reaper then never sees it. release_claim does this when a claim ends;
-- batch_park does it alone, since a context out in a batch job keeps its claim. Once the user
-- holds no lease, the zset's only other member, the deferral horizon of claim_due.lua, goes with
-- it (it only orders a capped user's backlog).
--
--   inflight  zset  context id -> lease expiry (epoch ms)
--   users     uinflight:<user> zset  the user's in-flight contexts -> lease expiry
--   id        context id
local function leave_lease(inflight, users, id)
  redis.call('ZREM', inflight, id)
  redis.call('ZREM', users, id)
  if redis.call('ZCARD', users) == 1 and redis.call('ZSCORE', users, '~defer') then
    redis.call('DEL', users)
  end
end
