-- KEYS[1] = lease     {prefix}:{cid}:lease
-- KEYS[2] = spent     {prefix}:{cid}:spent:{token}
-- ARGV[1] = holder: 'agent:' .. the turn's token
-- ARGV[2] = 'free' (the turn ended without storing anything) or 'park' (it awaits approval)
-- ARGV[3] = park: the approval ttl ms (the parked lease expires with it);
--           free: '' or, for a discarded continuation, how long its spent mark is kept (ms)
-- Ends or parks an in-process turn's hold on the conversation. Only the holder's lease is
-- touched; a discarded token is marked spent whatever became of its lease. Repeating it
-- changes nothing.
-- Returns {'OK'} / {'GONE'} (the lease is not this holder's; only the spent mark is set)
--      or {'CORRUPT', key} (nothing written).
redis.replicate_commands()
local lease, spent = KEYS[1], KEYS[2]
if wrong_type('hash', {lease}) then
  return {'CORRUPT', lease}
end
if ARGV[2] == 'free' and ARGV[3] ~= '' then
  redis.call('SET', spent, '1', 'PX', ARGV[3])
end
if redis.call('HGET', lease, 'holder') ~= ARGV[1] then
  return {'GONE'}
end
if ARGV[2] == 'park' then
  redis.call('HSET', lease, 'state', 'parked', 'expires_ms', istr(now_ms() + tonumber(ARGV[3])))
  redis.call('PEXPIRE', lease, ARGV[3])
else
  redis.call('DEL', lease)
end
return {'OK'}
