-- leave_lease — take a context out of `inflight`, and count it out of its user's live leases
-- (the per-user cap of claim_due.lua). The count is kept beside `inflight` and moves with it: a
-- claim adds 1 for each id it adds, this takes 1 off only when the id really left, so the count
-- is always the user's ids in `inflight`, however often a script ends the same claim. A lost
-- worker's lease is counted until the reaper (first in every tick) ends it here. Once the user
-- holds no lease, its deferral horizon (`~<user>`, claim_due.lua's bulk skip) goes too.
-- release_claim does this when a claim ends; batch_park does it alone, since a context out in a
-- batch job keeps its claim.
--
--   inflight  zset  context id -> lease expiry (epoch ms)
--   leases    uleases hash  user part -> live leases in this shard; `~<user part>` -> horizon
--   id        context id
--- @include "includes/user_part"
local function leave_lease(inflight, leases, id)
  if redis.call('ZREM', inflight, id) == 1 then
    local user = user_part(id)
    if redis.call('HINCRBY', leases, user, -1) <= 0 then
      redis.call('HDEL', leases, user, '~' .. user)
    end
  end
end
