-- user_part — the user part of a context id `<thread>:<user>:<agent>`: each part is encoded
-- (memq.core.identity: never a colon), so the user's is the middle one, exactly as its keys and
-- folders name the user. An id of another shape (not one of ours) gets the empty user: it can
-- still be claimed, dropped or reaped, never crash a batch. The one reading of an id's user in
-- Lua; memq.core.identity `user_id_of` is the same split in Python.
--
--   id  context id
local function user_part(id)
  return string.match(id, '^[^:]*:([^:]*):[^:]*$') or ''
end
