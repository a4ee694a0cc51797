-- KEYS[1] = lease     {prefix}:{cid}:lease
-- ARGV[1] = fence
-- ARGV[2] = lease ms
-- Extends an active lease held with this fence.
-- Returns {'OK'} or {'STALE'}.
redis.replicate_commands()
local lease = KEYS[1]
local l = redis.call('HMGET', lease, 'fence', 'state')
if l[1] ~= ARGV[1] or l[2] ~= 'active' then
  return {'STALE'}
end
redis.call('HSET', lease, 'expires_ms', istr(now_ms() + tonumber(ARGV[2])))
redis.call('PEXPIRE', lease, ARGV[2])
return {'OK'}
