-- KEYS[1] = lease     {prefix}:{cid}:lease
-- KEYS[2] = inbox     {prefix}:{cid}:inbox                 (KEYS[2..3] only with ARGV[3])
-- KEYS[3] = turn      {prefix}:{cid}:turn:{tid}
-- ARGV[1] = fence
-- ARGV[2] = lease ms
-- ARGV[3] = turn id: the turn being run under the lease (optional)
-- Extends an active lease held with this fence; with a turn id, only while that turn is
-- still the running inbox head (a renewal that arrives after its run ended extends
-- nothing), and reports whether a cancel was requested for it.
-- Returns {'OK', '1' if a cancel was requested else '0'} or {'STALE'} or {'ENDED'}.
redis.replicate_commands()
local lease = KEYS[1]
local l = redis.call('HMGET', lease, 'fence', 'state')
if l[1] ~= ARGV[1] or l[2] ~= 'active' then
  return {'STALE'}
end
local cancel = false
if ARGV[3] then
  if redis.call('LINDEX', KEYS[2], 0) ~= ARGV[3]
      or redis.call('HGET', KEYS[3], 'status') ~= 'running' then
    return {'ENDED'}
  end
  cancel = cancel_requested(KEYS[3])
end
redis.call('HSET', lease, 'expires_ms', istr(now_ms() + tonumber(ARGV[2])))
redis.call('PEXPIRE', lease, ARGV[2])
return {'OK', cancel and '1' or '0'}
