-- rewrite_document.lua: compare-and-set of one (user, agent) memory document that replaces its
-- whole history too (forgetting a thread takes its entries out of the history).
--
-- KEYS[1]  memory document hash  (fields: `doc` = memory.json text, `rev` = revision, integer)
-- KEYS[2]  memory history list   (JSON change entries, oldest first)
--
-- ARGV[1]  expected revision (integer): the one the caller read both document and history at
-- ARGV[2]  the new memory.json text
-- ARGV[3..n]  the new history entries, oldest first (JSON, one change each), possibly none
--
-- Every save bumps the revision and appends history in the same step, so an unchanged revision
-- means the history read with it is unchanged too.
--
-- Returns {code, revision}:
--   {1, new revision}      written
--   {0, current revision}  conflict: the stored revision is not the expected one, nothing written

local current = tonumber(redis.call('HGET', KEYS[1], 'rev') or '0')
if current ~= tonumber(ARGV[1]) then
  return {0, current}
end
local revision = current + 1
redis.call('HSET', KEYS[1], 'doc', ARGV[2], 'rev', revision)
redis.call('DEL', KEYS[2])
for i = 3, #ARGV do
  redis.call('RPUSH', KEYS[2], ARGV[i])
end
return {1, revision}
