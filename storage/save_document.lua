-- save_document.lua: compare-and-set of one (user, agent) memory document, plus its history,
-- optionally fenced by the claim of the context whose extraction writes it.
--
-- KEYS[1]  memory document hash  (fields: `doc` = memory.json text, `rev` = revision, integer,
--          `gen` = generation: a random value set when the document is created)
-- KEYS[2]  memory history list   (JSON change entries, oldest first)
-- KEYS[3]  ctx:<id> hash of the fencing context (only when ARGV[4] is not ""); same hash tag
-- KEYS[4]  wm:<id>  the fencing context's watermark (only when ARGV[5] is not ""); same hash tag
--
-- ARGV[1]  expected revision (integer; 0 = the document must not exist yet; -1 = unconditional)
-- ARGV[2]  the new memory.json text
-- ARGV[3]  history bound (entries kept; 0 = keep no history)
-- ARGV[4]  fence: the claim token the writing run holds; "" = not fenced (hand edits, imports)
-- ARGV[5]  the run's new watermark for KEYS[4]; "" = leave it (no fence, or nothing to record)
-- ARGV[6]  watermark time to live, milliseconds (read only with ARGV[5])
-- ARGV[7]  expected generation ("" = a document saved before generations, or none yet); read
--          only with ARGV[1] >= 0
-- ARGV[8]  the generation of the document if this save creates it (a fresh random value)
-- ARGV[9..n]  history entries to append (JSON, one change each), possibly none
--
-- The generation tells a document from one deleted and created again since it was read: a
-- revision starts again at 1, so the revision alone could match the one read (a forget, then
-- new runs) and the save would put back what was forgotten.
--
-- The watermark moves with the document it describes: a worker killed after this save and
-- before its settlement leaves the next run nothing new to send (no fact extracted twice).
--
-- Returns {code, revision}:
--   {1, new revision}      saved (history appended and trimmed in the same step)
--   {0, current revision, current text or nil, current generation}
--                          conflict: the stored revision or generation is not the expected one,
--                          nothing written; the document as it is now, so the caller can apply
--                          its change again without reading it first
--   {2, current revision}  fenced: the context's current claim token is not ARGV[4] (its lease was
--                          lost, it was re-claimed, or the user was forgotten); nothing written

local expected = tonumber(ARGV[1])
local stored = redis.call('HMGET', KEYS[1], 'rev', 'gen')
local current = tonumber(stored[1] or '0')
local generation = stored[2] or ''

if ARGV[4] ~= '' and redis.call('HGET', KEYS[3], 'claim_token') ~= ARGV[4] then
  return {2, current}
end
if expected >= 0 and (current ~= expected or generation ~= ARGV[7]) then
  return {0, current, redis.call('HGET', KEYS[1], 'doc'), generation}
end

local revision = current + 1
if stored[1] then
  redis.call('HSET', KEYS[1], 'doc', ARGV[2], 'rev', revision)
else
  redis.call('HSET', KEYS[1], 'doc', ARGV[2], 'rev', revision, 'gen', ARGV[8])
end

if ARGV[5] ~= '' then
  redis.call('SET', KEYS[4], ARGV[5], 'PX', ARGV[6])
end

local bound = tonumber(ARGV[3])
if bound > 0 and #ARGV > 8 then
  for i = 9, #ARGV do
    redis.call('RPUSH', KEYS[2], ARGV[i])
  end
  redis.call('LTRIM', KEYS[2], -bound, -1)
end

return {1, revision}
