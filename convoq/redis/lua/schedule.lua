-- KEYS[1] = meta      {prefix}:{cid}:meta
-- KEYS[2] = timers    {prefix}:{cid}:timers (zset: turn id -> due ms)
-- KEYS[3] = turn      {prefix}:{cid}:turn:{tid}
-- KEYS[4] = events    {prefix}:{cid}:events:{tid}
-- KEYS[5] = inbox     {prefix}:{cid}:inbox
-- KEYS[6] = lease     {prefix}:{cid}:lease
-- KEYS[7] = idem      {prefix}:{cid}:idem:{sha256(idempotency key)} (optional)
-- ARGV[1] = turn id
-- ARGV[2] = agent name
-- ARGV[3] = input message JSON
-- ARGV[4] = options JSON
-- ARGV[5] = turn ttl ms (idempotency key expiry)
-- ARGV[6] = events stream MAXLEN (approximate)
-- ARGV[7] = not before this time, ms since the epoch ('' for none)
-- ARGV[8] = at least this delay, ms from the server clock ('' for none); with both, the
--           turn is due at the later of the two
-- ARGV[9] = metadata JSON of the "scheduled" event ('' for none)
-- ARGV[10] = 'queue' or 'reject' (refuse it while the conversation is busy now: turns
--           queued, or its lease held)
-- Schedules a turn: its record (status scheduled, due_ms) and its timer, together. It
-- joins no inbox here: fire.lua queues it when it is due. A known idempotency key, or a
-- turn id already stored (a resent schedule), writes nothing and answers with the first
-- turn.
-- Returns {'OK', id of the "scheduled" event, created ms, due ms}
--      or {'DUP', turn id} (the first turn: the caller reads where it stands)
--      or {'BUSY'} / {'VERSION', v} / {'CORRUPT', key} / {'BAD_DUE'} (nothing written).
redis.replicate_commands()
local meta, timers, turn, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local inbox, lease, idem = KEYS[5], KEYS[6], KEYS[7]
local tid = ARGV[1]
if idem then
  local first = touch(idem, 'GET', idem)
  if first == nil then
    return {'CORRUPT', idem}
  end
  if first then
    return {'DUP', first}
  end
end
if redis.call('EXISTS', turn) == 1 then
  return {'DUP', tid}
end
local refusal = meta_refusal(meta)
if refusal then
  return refusal
end
local bad = wrong_type('zset', {timers}) or wrong_type('list', {inbox})
if bad then
  return {'CORRUPT', bad}
end
if ARGV[10] == 'reject' and (redis.call('LLEN', inbox) > 0 or redis.call('EXISTS', lease) == 1) then
  return {'BUSY'}
end
local now = now_ms()
local due = -1
if ARGV[7] ~= '' then
  due = tonumber(ARGV[7]) or -1
end
if ARGV[8] ~= '' then
  local delay = tonumber(ARGV[8])
  if not delay or delay < 0 or (ARGV[7] ~= '' and due < 0) then
    due = -1
  else
    due = math.max(due, now + delay)
  end
elseif ARGV[7] == '' then
  due = -1
end
if not due or due < 0 or due ~= math.floor(due) or due >= 2^53 then
  return {'BAD_DUE'}
end
local data = '{"status":"scheduled","due_ms":' .. istr(due)
if ARGV[9] ~= '' then
  data = data .. ',"metadata":' .. ARGV[9]
end
-- The events key is the first write: one of another type refuses it, nothing written.
local id = touch(events, 'XADD', events, 'MAXLEN', '~', ARGV[6], '*', 'type', 'status',
  'data', data .. '}')
if id == nil then
  return {'CORRUPT', events}
end
redis.call('HSET', turn, 'status', 'scheduled', 'agent', ARGV[2], 'input', ARGV[3],
  'options', ARGV[4], 'attempts', '0', 'runs', '0', 'created_ms', istr(now),
  'due_ms', istr(due), 'last_event', id)
redis.call('ZADD', timers, istr(due), tid)
if idem then
  redis.call('SET', idem, tid, 'PX', ARGV[5])
end
return {'OK', id, istr(now), istr(due)}
