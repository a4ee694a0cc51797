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
-- ARGV[8] = JSON list of the pending call ids that wait for a child turn (sub-agent calls;
--           decided by their children, never by a person)
-- ARGV[9] = n: events the turn emitted since its last write
-- ARGV[10 .. 9+2n] = type, data, type, data, ... (appended before the status change)
-- Parks the running turn until its tool calls are decided: the conversation stays reserved
-- by a lease in state "parked" that lives as long as the approval may wait. The status is
-- "awaiting_approval" when a person must decide some call, else "waiting" (every pending
-- call waits for a child turn).
-- Returns {'OK'}, {'PARKED'} (replayed: already parked with this fence)
--      or {'UNKNOWN'|'APPLIED'|'STALE'|'NOT_HEAD'|'NOT_RUNNING'} / {'CORRUPT', key}.
redis.replicate_commands()
local k, corrupt = turn_ending(1)
if corrupt then
  return corrupt
end
local lease, turn = k.lease, k.turn
local ok_p, pending = pcall(cjson.decode, ARGV[4])
local ok_c, children = pcall(cjson.decode, ARGV[8])
if not (ok_p and ok_c and type(pending) == 'table' and type(children) == 'table') then
  return {'BAD_ARGS'}
end
local parks_as = #children < #pending and 'awaiting_approval' or 'waiting'
local l = redis.call('HMGET', lease, 'fence', 'state')
if l[1] == ARGV[2] and l[2] == 'parked' and PARKED[redis.call('HGET', turn, 'status')] then
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
emit_batch(k.events, ARGV[7], 10, tonumber(ARGV[9]))
redis.call('SET', k.cont, ARGV[3])
redis.call('DEL', k.journal)
redis.call('HSET', turn, 'status', parks_as, 'result', ARGV[5], 'pending', ARGV[4],
  'children', ARGV[8], 'resume', '0', 'parked_ms', istr(now))
redis.call('HSET', lease, 'state', 'parked', 'expires_ms', istr(now + tonumber(ARGV[6])))
redis.call('PEXPIRE', lease, ARGV[6])
emit(k.events, ARGV[7], 'status', status_data(parks_as))
return {'OK'}
