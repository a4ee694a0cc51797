-- KEYS[1] = meta      {prefix}:{cid}:meta
-- KEYS[2] = inbox     {prefix}:{cid}:inbox
-- KEYS[3] = turn      {prefix}:{cid}:turn:{tid}
-- KEYS[4] = events    {prefix}:{cid}:events:{tid}
-- KEYS[5] = lease     {prefix}:{cid}:lease
-- KEYS[6] = idem      {prefix}:{cid}:idem:{sha256(idempotency key)} (optional)
-- KEYS[6 or 7 ..] = turn, journal, cont, events of the turn ARGV[11] names (only then)
-- KEYS[last] = kick queue: the broker's list of the conversation's Celery queue, when
--           the broker is this (non-cluster) Redis (only with ARGV[10])
-- ARGV[1] = turn id
-- ARGV[2] = agent name
-- ARGV[3] = input message JSON
-- ARGV[4] = options JSON
-- ARGV[5] = 'queue' or 'reject' (when the conversation is busy: turns queued, or its
--           lease held), or (double texting) 'interrupt' / 'rollback' (the inbox head is
--           stopped: stop_head()) or 'merge' (the turn may join the inbox tail: merge_into())
-- ARGV[6] = turn ttl ms (idempotency key expiry)
-- ARGV[7] = events stream MAXLEN (approximate)
-- ARGV[8] = the most turns the inbox may hold (0: no limit)
-- ARGV[9] = data JSON of the "queued" status event (the status and the turn's metadata)
-- ARGV[10] = the kick: the kombu message (JSON) to LPUSH onto the kick queue when the
--           conversation was idle (optional; '' = none)
-- ARGV[11] = with interrupt / rollback / merge: the inbox head (interrupt, rollback) or
--           tail (merge) the caller read, '' = the inbox was empty
-- ARGV[12] = interrupt / rollback: the error JSON of a head ended here; merge: the merge key
-- ARGV[13] = merge: the most bytes the inputs of one merged turn may take
-- Queues a turn. A known idempotency key, or a turn id already stored (a resent submit),
-- queues nothing and answers with the first turn.
-- Returns {'OK', position, id of the "queued" event, created ms, kicked, stopped}
--         (position 0: the conversation was idle and needs a kick; kicked 1: this script
--         pushed it, 0: the caller sends it; stopped: what became of the head, stop_head():
--         'cancelled' also needs a kick)
--      or {'MERGED', turn joined, its position} (merge_into())
--      or {'MOVED'} (the head or tail is not ARGV[11] any more: nothing written)
--      or {'DUP', turn id, position or -1 when no longer queued}
--      or {'BUSY'} / {'FULL', waiting} / {'VERSION', v} / {'CORRUPT', key} (nothing
--         written).
redis.replicate_commands()
local meta, inbox, turn, events, lease = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local kick = ARGV[10] ~= '' and ARGV[10] or nil
local queue = kick and KEYS[#KEYS]
local mode, seen = ARGV[5], ARGV[11]
local other = (seen or '') ~= '' and 4 or 0  -- the keys of the head or tail it acts on
local idem = (#KEYS - (queue and 1 or 0) - other == 6) and KEYS[6] or nil
local target = other > 0 and turn_keys(inbox, lease, (idem and 7 or 6)) or nil
local tid = ARGV[1]
local function queued_position(id)
  local pos = redis.call('LPOS', inbox, id)
  if pos then
    return pos
  end
  return -1
end
if idem then
  local first = redis.call('GET', idem)
  if first then
    return {'DUP', first, queued_position(first)}
  end
end
if redis.call('EXISTS', turn) == 1 then
  return {'DUP', tid, queued_position(tid)}
end
local refusal = meta_refusal(meta)
if refusal then
  return refusal
end
if seen then
  refusal = busy_moved(inbox, mode == 'merge' and -1 or 0, seen, target)
  if refusal then
    return refusal
  end
end
if mode == 'merge' and mergeable(target, ARGV[12], ARGV[3], tonumber(ARGV[13])) then
  if not merge_into(target, seen, turn, events, tid, ARGV[2], ARGV[3], ARGV[4], ARGV[6],
      ARGV[7]) then
    return {'CORRUPT', events}
  end
  if idem then
    redis.call('SET', idem, tid, 'PX', ARGV[6])
  end
  return {'MERGED', seen, redis.call('LPOS', inbox, seen)}
end
-- The turn joins the inbox first: the push is the inbox's type check and its length
-- answers how many wait before it (no LLEN). A refusal below takes the push back (the
-- turn id is the tail: RPOP), so a refused submit leaves nothing written.
local waiting = touch(inbox, 'RPUSH', inbox, tid)
if waiting == nil then
  return {'CORRUPT', inbox}
end
waiting = waiting - 1
-- An in-process turn (an Agent on Redis memory) holds the lease with nothing queued.
if ARGV[5] == 'reject' and (waiting > 0 or redis.call('EXISTS', lease) == 1) then
  redis.call('RPOP', inbox)
  return {'BUSY'}
end
local max_waiting = tonumber(ARGV[8] or '0')
if max_waiting > 0 and waiting >= max_waiting then
  redis.call('RPOP', inbox)
  return {'FULL', waiting}
end
-- An events key of another type refuses it, with the push taken back.
local queued = touch(events, 'XADD', events, 'MAXLEN', '~', ARGV[7], '*', 'type', 'status',
  'data', ARGV[9])
if queued == nil then
  redis.call('RPOP', inbox)
  return {'CORRUPT', events}
end
-- The new stream's first id is the server time in ms: the record's creation time. The
-- record keeps it as the stream's last id (a hint for emit_events()). The stream gets
-- its TTL when the turn ends, as the record does: a queued turn keeps both.
local now = tonumber(string.match(queued, '^(%d+)'))
redis.call('HSET', turn, 'status', 'queued', 'agent', ARGV[2], 'input', ARGV[3],
  'options', ARGV[4], 'attempts', '0', 'runs', '0', 'created_ms', istr(now),
  'last_event', queued)
if mode == 'merge' then
  redis.call('HSET', turn, 'merge_key', ARGV[12])
end
local stopped = ''
if mode == 'interrupt' or mode == 'rollback' then
  stopped = stop_head(target, lease, seen, mode, tid, ARGV[12], ARGV[6], ARGV[7])
  if stopped == 'cancelled' then
    waiting = waiting - 1  -- the head left the inbox
  end
end
-- No format stamp here: the version names the layout of the history, and the first write
-- of anything in the conversation's meta (acquire's fence, commit, a memory append)
-- stamps it (the read above refuses another version all the same).
if idem then
  redis.call('SET', idem, tid, 'PX', ARGV[6])
end
-- The kick comes last, and a broker list of another type only leaves it to the caller
-- (who logs it; the sweeper kicks the conversation): the turn is queued either way.
local kicked = 0
if queue and (waiting == 0 or stopped == 'cancelled') then
  local pushed = redis.pcall('LPUSH', queue, kick)
  if type(pushed) ~= 'table' then
    kicked = 1
  end
end
return {'OK', waiting, queued, istr(now), kicked, stopped}
