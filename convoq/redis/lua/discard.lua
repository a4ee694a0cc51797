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
-- Ends a parked turn as cancelled, storing nothing; frees the conversation.
-- Returns {'OK', turns still queued, the inbox head now or false}
--      or {'UNKNOWN'} / {'FINISHED', status, turns queued, the inbox head or false}
--      or {'NOT_PARKED', status} / {'CORRUPT', key}.
redis.replicate_commands()
local k, corrupt = turn_ending(1)
if corrupt then
  return corrupt
end
local rec = redis.call('HMGET', k.turn, 'status')
if not rec[1] then
  return {'UNKNOWN'}
end
if TERMINAL[rec[1]] then
  return {'FINISHED', rec[1], redis.call('LLEN', k.inbox), redis.call('LINDEX', k.inbox, 0)}
end
if not PARKED[rec[1]] then
  return {'NOT_PARKED', rec[1]}
end
finish(k, ARGV[1], 'cancelled', 'error', ARGV[2], ARGV[3], ARGV[4], now_ms())
redis.call('DEL', k.lease)
return {'OK', redis.call('LLEN', k.inbox), redis.call('LINDEX', k.inbox, 0)}
