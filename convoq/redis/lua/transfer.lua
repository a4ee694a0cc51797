-- KEYS[1] = inbox     {prefix}:{cid}:inbox
-- KEYS[2] = lease     {prefix}:{cid}:lease
-- KEYS[3] = turn      {prefix}:{cid}:turn:{tid}
-- KEYS[4] = journal   {prefix}:{cid}:journal:{tid}
-- KEYS[5] = events    {prefix}:{cid}:events:{tid}
-- ARGV[1] = turn id
-- ARGV[2] = fence
-- ARGV[3] = TurnState JSON (the turn so far: its last step the handoff)
-- ARGV[4] = the agent the turn goes on as
-- ARGV[5] = turn ttl ms (the journal outlives no turn)
-- ARGV[6] = events stream MAXLEN (approximate)
-- ARGV[7] = '1': free the lease (the turn is queued again for the pool serving the
--           agent); '0': keep it (this worker goes on as the agent)
-- ARGV[8] = n: events the turn emitted since its last write
-- ARGV[9 .. 8+2n] = type, data, type, data, ... (appended before the journal is written)
-- Hands a running turn to another agent (a handoff), fenced like checkpoint: journals the
-- turn so far, sets the record's agent (the first time it changes keeping the agent it
-- was queued for as handed_from), and with ARGV[7] frees the lease, the run not counted
-- as a crash (the next run's "resumed" event says handed_off). The inbox is left as it is: the turn
-- stays its head, so a worker that dies before it kicks the agent's pool loses nothing (the
-- sweeper finds a head with no lease). A resend finds the journal and agent set already
-- and writes nothing again (with ARGV[7] the lease is gone: it is refused STALE).
-- Returns {'OK', '0'} (checkpoint's reply, no cancel said)
--      or {'UNKNOWN'|'APPLIED'|'STALE'|'NOT_HEAD'|'NOT_RUNNING'} / {'CORRUPT', key}.
redis.replicate_commands()
local inbox, lease, turn, journal, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local refused, where = guard_run(lease, inbox, turn, ARGV[1], ARGV[2], {running = true})
if refused then
  return {refused, where}
end
local bad = wrong_type('string', {journal}) or bad_counters(turn, 'runs')
local n = tonumber(ARGV[8])
if not bad and n > 0 then
  bad = wrong_type('stream', {events})
end
if bad then
  return {'CORRUPT', bad}
end
local rec = redis.call('HMGET', turn, 'agent', 'handed_from', 'runs')
if not (redis.call('GET', journal) == ARGV[3] and rec[1] == ARGV[4]) then
  emit_batch(events, ARGV[6], 9, n)
  if n > 0 then
    redis.call('PEXPIRE', events, ARGV[5])
  end
  redis.call('SET', journal, ARGV[3], 'PX', ARGV[5])
  redis.call('HSET', turn, 'journaled', '1', 'agent', ARGV[4])
  if not rec[2] and rec[1] ~= ARGV[4] then
    redis.call('HSET', turn, 'handed_from', rec[1] or '')
  end
end
if ARGV[7] == '1' then
  if tonumber(rec[3] or '0') > 0 then
    redis.call('HINCRBY', turn, 'runs', -1)
  end
  redis.call('HSET', turn, 'handed_back', 'handoff')
  redis.call('DEL', lease)
end
return {'OK', '0'}
