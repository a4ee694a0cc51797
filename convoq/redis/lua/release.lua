-- KEYS[1] = lease     {prefix}:{cid}:lease
-- KEYS[2] = inbox     {prefix}:{cid}:inbox
-- KEYS[3] = turn      {prefix}:{cid}:turn:{tid}
-- ARGV[1] = fence
-- ARGV[2] = turn id: the turn run under the lease, handed back unfinished
-- Hands a conversation back (a worker shutting down): frees the lease held with this
-- fence so any worker may take the turn at once; the run does not count as an attempt
-- (it was stopped, it did not crash), and the turn is marked handed back (the next run's
-- "resumed" event says worker_stopped). Its journal stays: the next run goes on from it.
-- Returns {'OK'} or {'STALE'}.
local l = redis.call('HMGET', KEYS[1], 'fence', 'state')
if l[1] ~= ARGV[1] or l[2] ~= 'active' then
  return {'STALE'}
end
-- A damaged record is left as it is (the next acquire reports it); the lease goes anyway.
local sane = not (wrong_type('list', {KEYS[2]}) or wrong_type('hash', {KEYS[3]})
  or bad_counters(KEYS[3], 'runs'))
if sane and redis.call('LINDEX', KEYS[2], 0) == ARGV[2]
    and redis.call('HGET', KEYS[3], 'status') == 'running'
    and tonumber(redis.call('HGET', KEYS[3], 'runs') or '0') > 0 then
  redis.call('HINCRBY', KEYS[3], 'runs', -1)
  redis.call('HSET', KEYS[3], 'handed_back', '1')
end
redis.call('DEL', KEYS[1])
return {'OK'}
