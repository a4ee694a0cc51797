-- KEYS[1] = lease     {prefix}:{cid}:lease
-- KEYS[2] = turn      {prefix}:{cid}:turn:{tid}
-- ARGV[1] = tool call id
-- ARGV[2] = decision JSON {"approved": bool, "reason": str|null}
-- Records a decision on a pending call of a parked turn. Once every pending call is
-- decided the parked lease is dropped and the turn is marked for resumption: the next
-- acquire hands it out with its continuation and the decisions.
-- Returns {'RESUME'} / {'PENDING'}
--      or {'UNKNOWN'} / {'NOT_PARKED', status} / {'UNKNOWN_CALL', pending ids JSON}
--      or {'DECIDED'} (the call was decided differently) / {'EXPIRED'} (approval expired).
local lease, turn = KEYS[1], KEYS[2]
local rec = redis.call('HMGET', turn, 'status', 'pending', 'resume')
if not rec[1] then
  return {'UNKNOWN'}
end
if rec[1] ~= 'awaiting_approval' then
  return {'NOT_PARKED', rec[1]}
end
local ok, pending = pcall(cjson.decode, rec[2] or '[]')
if not ok or type(pending) ~= 'table' then
  pending = {}
end
local known = false
for _, id in ipairs(pending) do
  if id == ARGV[1] then
    known = true
  end
end
if not known then
  return {'UNKNOWN_CALL', rec[2] or '[]'}
end
local field = 'decision:' .. ARGV[1]
local previous = redis.call('HGET', turn, field)
if previous and previous ~= ARGV[2] then
  return {'DECIDED'}
end
if not previous then
  if rec[3] ~= '1' and redis.call('HGET', lease, 'state') ~= 'parked' then
    return {'EXPIRED'}
  end
  redis.call('HSET', turn, field, ARGV[2])
end
for _, id in ipairs(pending) do
  if redis.call('HEXISTS', turn, 'decision:' .. id) == 0 then
    return {'PENDING'}
  end
end
if rec[3] ~= '1' then
  redis.call('HSET', turn, 'resume', '1')
  redis.call('DEL', lease)
end
return {'RESUME'}
