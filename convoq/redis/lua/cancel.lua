-- KEYS[1] = inbox     {prefix}:{cid}:inbox
-- KEYS[2] = lease     {prefix}:{cid}:lease
-- KEYS[3] = turn      {prefix}:{cid}:turn:{tid}
-- KEYS[4] = journal   {prefix}:{cid}:journal:{tid}
-- KEYS[5] = cont      {prefix}:{cid}:cont:{tid}
-- KEYS[6] = events    {prefix}:{cid}:events:{tid}
-- KEYS[7] = timers    {prefix}:{cid}:timers (optional: a scheduled turn's timer goes too)
-- ARGV[1] = turn id
-- ARGV[2] = error JSON (TurnCancelledError data)
-- ARGV[3] = turn ttl ms
-- ARGV[4] = events stream MAXLEN (approximate)
-- Cancels a turn: a queued one (or a running one whose lease is gone) leaves the inbox; a
-- parked one is discarded; a scheduled one loses its timer; a running one gets a cancel
-- flag its runner polls.
-- Returns {'CANCELLED', the inbox head now or false (none waits): the turn the caller's
--      kick is for} / {'STOPPING'} / {'FINISHED'} / {'UNKNOWN'} / {'CORRUPT', key}.
redis.replicate_commands()
local k, corrupt = turn_ending(1)
if corrupt then
  return corrupt
end
local timers = KEYS[7]
if timers and wrong_type('zset', {timers}) then
  return {'CORRUPT', timers}
end
local status = redis.call('HGET', k.turn, 'status')
if not status then
  return {'UNKNOWN'}
end
if TERMINAL[status] then
  return {'FINISHED'}
end
local lease_state = redis.call('HGET', k.lease, 'state')
if status == 'running' and lease_state == 'active' then
  redis.call('HSET', k.turn, 'cancel', '1')
  return {'STOPPING'}
end
finish(k, ARGV[1], 'cancelled', 'error', ARGV[2], ARGV[3], ARGV[4], now_ms())
if PARKED[status] then
  redis.call('DEL', k.lease)
end
if timers and status == 'scheduled' then
  redis.call('ZREM', timers, ARGV[1])
end
return {'CANCELLED', redis.call('LINDEX', k.inbox, 0)}
