-- KEYS[1] = inbox     {prefix}:{cid}:inbox
-- KEYS[2] = lease     {prefix}:{cid}:lease
-- KEYS[3] = turn      {prefix}:{cid}:turn:{tid}
-- KEYS[4] = journal   {prefix}:{cid}:journal:{tid}
-- KEYS[5] = cont      {prefix}:{cid}:cont:{tid}
-- KEYS[6] = events    {prefix}:{cid}:events:{tid}
-- ARGV[1] = turn id
-- ARGV[2] = error JSON (TurnCancelledError data)
-- ARGV[3] = turn ttl ms
-- ARGV[4] = events stream MAXLEN (approximate)
-- Cancels a turn: a queued one (or a running one whose lease is gone) leaves the inbox; a
-- parked one is discarded; a running one gets a cancel flag its runner polls.
-- Returns {'CANCELLED'} / {'STOPPING'} / {'FINISHED'} / {'UNKNOWN'}.
redis.replicate_commands()
local inbox, lease = KEYS[1], KEYS[2]
local k = {inbox = inbox, turn = KEYS[3], journal = KEYS[4], cont = KEYS[5], events = KEYS[6]}
local status = redis.call('HGET', k.turn, 'status')
if not status then
  return {'UNKNOWN'}
end
if TERMINAL[status] then
  return {'FINISHED'}
end
local lease_state = redis.call('HGET', lease, 'state')
if status == 'running' and lease_state == 'active' then
  redis.call('HSET', k.turn, 'cancel', '1')
  return {'STOPPING'}
end
finish(k, ARGV[1], 'cancelled', 'error', ARGV[2], ARGV[3], ARGV[4], now_ms())
if status == 'awaiting_approval' then
  redis.call('DEL', lease)
end
return {'CANCELLED'}
