-- KEYS[1] = inbox     {prefix}:{cid}:inbox
-- KEYS[2] = lease     {prefix}:{cid}:lease
-- KEYS[3] = turn      {prefix}:{cid}:turn:{tid}
-- KEYS[4] = journal   {prefix}:{cid}:journal:{tid}
-- KEYS[5] = cont      {prefix}:{cid}:cont:{tid}
-- KEYS[6] = events    {prefix}:{cid}:events:{tid}
-- ARGV[1] = turn id
-- ARGV[2] = fence
-- ARGV[3] = error JSON {type, message, details}
-- ARGV[4] = final status: 'failed' or 'cancelled'
-- ARGV[5] = turn ttl ms
-- ARGV[6] = events stream MAXLEN (approximate)
-- ARGV[7] = lease ms (for the hand-off to the next turn)
-- ARGV[8] = n: events the turn emitted since its last write
-- ARGV[9 .. 8+2n] = type, data, type, data, ... (appended before "done")
-- Ends the head turn without storing anything in history; guards as commit (a queued
-- head may be failed too: a handed-off turn that could not be loaded).
-- Returns {'OK', next turn id or false}
--      or {'UNKNOWN'|'APPLIED'|'STALE'|'NOT_HEAD'|'NOT_RUNNING'} / {'CORRUPT', key}.
redis.replicate_commands()
local k, corrupt = turn_ending(1)
if corrupt then
  return corrupt
end
local tid = ARGV[1]
local refused = guard_run(k.lease, k.inbox, k.turn, tid, ARGV[2], {running = true, queued = true})
if refused then
  return {refused}
end
local now = now_ms()
emit_batch(k.events, ARGV[6], 9, tonumber(ARGV[8]))
finish(k, tid, ARGV[4], 'error', ARGV[3], ARGV[5], ARGV[6], now)
return {'OK', hand_off(k.lease, k.inbox, ARGV[7], now)}
