-- KEYS[1] = meta      {prefix}:{cid}:meta
-- KEYS[2] = turns     {prefix}:{cid}:turns
-- KEYS[3] = blobs     {prefix}:{cid}:blobs
-- KEYS[4] = lead      {prefix}:{cid}:lead
-- KEYS[5] = inbox     {prefix}:{cid}:inbox
-- KEYS[6] = lease     {prefix}:{cid}:lease
-- KEYS[7 ..] = every other key of the conversation (found by SCAN, plus the per-turn
--              keys of the turns in ARGV)
-- ARGV[1] = '1' to clear even while turns are queued, running or parked
-- ARGV[2 ..] = the inbox as the caller read it (its turns' keys are among KEYS)
-- Deletes the conversation (refused while a turn is queued, running or parked in the inbox).
-- Returns {'OK'} / {'BUSY'} / {'RETRY'} (the inbox changed since
-- the caller read it: read again).
local inbox, lease = KEYS[5], KEYS[6]
local queued = redis.call('LRANGE', inbox, 0, -1)
-- A lease parked with no turn queued is an in-process turn awaiting approval: clear drops
-- it (its continuation is then refused). A live one is a turn running.
local live = redis.call('TYPE', lease)['ok'] ~= 'hash' or redis.call('HGET', lease, 'state') == 'active'
if ARGV[1] ~= '1' and (#queued > 0 or live and redis.call('EXISTS', lease) == 1) then
  return {'BUSY'}
end
if #queued ~= #ARGV - 1 then
  return {'RETRY'}
end
for i, tid in ipairs(queued) do
  if ARGV[i + 1] ~= tid then
    return {'RETRY'}
  end
end
for first = 1, #KEYS, 500 do
  redis.call('UNLINK', unpack(KEYS, first, math.min(first + 499, #KEYS)))
end
return {'OK'}
