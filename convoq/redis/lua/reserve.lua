-- KEYS[1] = meta      {prefix}:{cid}:meta
-- KEYS[2] = inbox     {prefix}:{cid}:inbox
-- KEYS[3] = lease     {prefix}:{cid}:lease
-- KEYS[4] = spent     {prefix}:{cid}:spent:{token}
-- ARGV[1] = holder: 'agent:' .. the turn's token
-- ARGV[2] = lease ms
-- ARGV[3] = '' for a new turn; for a resumed continuation, how long its spent mark is
--           kept (ms): the token is spent here, so it runs once
-- Takes the conversation's lease for an in-process turn, the same lease workers take: a
-- new turn only when no turn is queued, running or parked; a resumed one only from its
-- own parked lease. A resend (the reply was lost) finds the lease taken by this holder
-- and answers with its fence.
-- Returns {'OK', fence} / {'BUSY'} / {'SPENT'} (already resumed or discarded) / {'GONE'}
--      (its parked lease expired or the conversation was cleared) / {'VERSION', v} /
--      {'CORRUPT', key} (nothing written).
redis.replicate_commands()
local meta, inbox, lease, spent = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local corrupt = wrong_type('hash', {meta, lease}) or wrong_type('list', {inbox})
  or bad_counters(meta, 'fence')
if corrupt then
  return {'CORRUPT', corrupt}
end
local l = redis.call('HMGET', lease, 'holder', 'fence', 'state')
if l[1] == ARGV[1] and l[3] == 'active' then
  return {'OK', l[2]}
end
local bad = bad_version(meta)
if bad then
  return {'VERSION', bad}
end
if ARGV[3] ~= '' then
  if redis.call('EXISTS', spent) == 1 then
    return {'SPENT'}
  end
  if l[1] ~= ARGV[1] or l[3] ~= 'parked' then
    return {'GONE'}
  end
elseif l[1] or redis.call('LLEN', inbox) > 0 then
  return {'BUSY'}
end
local fence = new_fence(meta)
redis.call('HSETNX', meta, 'format_version', FORMAT)
redis.call('HSET', lease, 'holder', ARGV[1], 'fence', fence, 'state', 'active',
  'expires_ms', istr(now_ms() + tonumber(ARGV[2])))
redis.call('PEXPIRE', lease, ARGV[2])
if ARGV[3] ~= '' then
  redis.call('SET', spent, '1', 'PX', ARGV[3])
end
return {'OK', fence}
