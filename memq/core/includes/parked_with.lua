-- parked_with — whether a context is in the batch lane with `token`: parked with it (its
-- `batch_token`) and still claimed by it (its `claim_token`; a later claim, e.g. a flush,
-- supersedes the batch and fences its answer off). The one reading of "parked with this token"
-- in Lua; worker/batch_queue.py `parked_with` is the same rule in Python.
--
--   claim  the hash's claim_token (false when absent: HMGET's nil)
--   batch  the hash's batch_token (likewise)
--   token  the claim token the caller holds (string)
local function parked_with(claim, batch, token)
  return batch == token and claim == token
end
