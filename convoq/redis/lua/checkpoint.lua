-- KEYS[1] = inbox     {prefix}:{cid}:inbox
-- KEYS[2] = lease     {prefix}:{cid}:lease
-- KEYS[3] = turn      {prefix}:{cid}:turn:{tid}
-- KEYS[4] = journal   {prefix}:{cid}:journal:{tid}
-- KEYS[5] = events    {prefix}:{cid}:events:{tid}
-- ARGV[1] = turn id
-- ARGV[2] = fence
-- ARGV[3] = TurnState JSON
-- ARGV[4] = turn ttl ms (the journal outlives no turn)
-- ARGV[5] = events stream MAXLEN (approximate)
-- ARGV[6] = n: events the turn emitted since its last write
-- ARGV[7 .. 6+2n] = type, data, type, data, ... (appended before the journal is written)
-- Journals the turn so far, fenced like commit, and tells the runner whether a cancel (or
-- an interrupt, stop_requested()) was requested (it stops before its next step), so the
-- runner needs no read of its own.
-- A resend (the reply was lost) finds its state journaled already and appends no event
-- twice: every step changes the state.
-- Returns {'OK', '1' if a cancel or an interrupt was requested else '0'}
--      or {'UNKNOWN'|'APPLIED'|'STALE'|'NOT_HEAD'|'NOT_RUNNING'} / {'CORRUPT', key}.
redis.replicate_commands()
local inbox, lease, turn, journal, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local refused, where, ahead = guard_run(lease, inbox, turn, ARGV[1], ARGV[2],
  {running = true})
if refused then
  return {refused, where}
end
if wrong_type('string', {journal}) then
  return {'CORRUPT', journal}
end
if redis.call('GET', journal) == ARGV[3] then
  return {'OK', stop_requested(turn) and '1' or '0'}
end
local n = tonumber(ARGV[6])
if n > 0 and wrong_type('stream', {events}) then
  return {'CORRUPT', events}
end
emit_batch(events, ARGV[5], 7, n)
if n > 0 then
  redis.call('PEXPIRE', events, ARGV[4])
end
redis.call('SET', journal, ARGV[3], 'PX', ARGV[4])
if not ahead.saved then
  redis.call('HSET', turn, 'journaled', '1')  -- its ending deletes the journal (guard_run)
end
return {'OK', stop_requested(turn) and '1' or '0'}
