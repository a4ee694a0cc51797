-- KEYS[1] = inbox     {prefix}:{cid}:inbox
-- KEYS[2] = lease     {prefix}:{cid}:lease
-- KEYS[3] = turn      {prefix}:{cid}:turn:{tid}
-- KEYS[4] = journal   {prefix}:{cid}:journal:{tid}
-- KEYS[5] = cont      {prefix}:{cid}:cont:{tid}
-- KEYS[6] = events    {prefix}:{cid}:events:{tid}
-- ARGV[1] = turn id
-- ARGV[2] = fence
-- ARGV[3] = continuation: TurnState JSON
-- ARGV[4] = JSON list of the pending tool call ids
-- ARGV[5] = result JSON {"pending_approvals": [...], "usage": the usage so far}
-- ARGV[6] = approval ttl ms (the parked lease expires with it)
-- ARGV[7] = events stream MAXLEN (approximate)
-- ARGV[8] = n: events the turn emitted since its last write
-- ARGV[9 .. 8+2n] = type, data, type, data, ... (appended before the status change)
-- Parks the running turn until its tool calls are decided: the conversation stays reserved
-- by a lease in state "parked" that lives as long as the approval may wait.
-- Returns {'OK'}, {'PARKED'} (replayed: already parked with this fence)
--      or {'UNKNOWN'|'APPLIED'|'STALE'|'NOT_HEAD'|'NOT_RUNNING'} / {'CORRUPT', key}.
redis.replicate_commands()
local k, corrupt = turn_ending(1)
if corrupt then
  return corrupt
end
local lease, turn = k.lease, k.turn
local l = redis.call('HMGET', lease, 'fence', 'state')
if l[1] == ARGV[2] and l[2] == 'parked' and redis.call('HGET', turn, 'status') == 'awaiting_approval' then
  return {'PARKED'}
end
local refused, where = guard_run(lease, k.inbox, turn, ARGV[1], ARGV[2], {running = true})
if refused then
  return {refused, where}
end
local ok, old = pcall(cjson.decode, redis.call('HGET', turn, 'pending') or '[]')
local now = now_ms()
if ok and type(old) == 'table' then
  for _, id in ipairs(old) do
    redis.call('HDEL', turn, 'decision:' .. id)
  end
end
emit_batch(k.events, ARGV[7], 9, tonumber(ARGV[8]))
redis.call('SET', k.cont, ARGV[3])
redis.call('DEL', k.journal)
redis.call('HSET', turn, 'status', 'awaiting_approval', 'result', ARGV[5], 'pending', ARGV[4],
  'resume', '0', 'parked_ms', istr(now))
redis.call('HSET', lease, 'state', 'parked', 'expires_ms', istr(now + tonumber(ARGV[6])))
redis.call('PEXPIRE', lease, ARGV[6])
emit(k.events, ARGV[7], 'status', status_data('awaiting_approval'))
return {'OK'}
