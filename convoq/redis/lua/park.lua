-- KEYS[1] = inbox     {prefix}:{cid}:inbox
-- KEYS[2] = lease     {prefix}:{cid}:lease
-- KEYS[3] = turn      {prefix}:{cid}:turn:{tid}
-- KEYS[4] = journal   {prefix}:{cid}:journal:{tid}
-- KEYS[5] = cont      {prefix}:{cid}:cont:{tid}
-- KEYS[6] = events    {prefix}:{cid}:events:{tid}
-- KEYS[7 ..] = kept signals {prefix}:{cid}:signal:{sha256(name)}, one per signal name a
--           pending call waits for (ARGV[8] says which call's is which)
-- ARGV[1] = turn id
-- ARGV[2] = fence
-- ARGV[3] = continuation: TurnState JSON
-- ARGV[4] = JSON list of the pending tool call ids
-- ARGV[5] = result JSON {"pending_approvals": [...], "usage": the usage so far, ...}
-- ARGV[6] = wait ttl ms (the parked lease expires with it: the approval expiry, or the
--           shortest deadline of the calls that wait for the world)
-- ARGV[7] = events stream MAXLEN (approximate)
-- ARGV[8] = JSON object: what each pending call waits for besides a person, by call id:
--           {"on": "child"} (a sub-agent call, decided by its child turn), {"on":
--           "result"} (a deferred call, decided by its result), {"on": "signal", "name":
--           name, "key": index in KEYS of its kept signals}; a call not in it waits for a
--           person
-- ARGV[9] = n: events the turn emitted since its last write
-- ARGV[10 .. 9+2n] = type, data, type, data, ... (appended before the status change)
-- Parks the running turn until its tool calls are decided: the conversation stays reserved
-- by a lease in state "parked" that lives as long as the wait may. The status is
-- "awaiting_approval" when a person must decide some call, else "waiting". A call that
-- waits for a signal takes the oldest live one kept for its name (signal.lua keeps those
-- sent before the wait), decided at once; when that decides every pending call the turn
-- is marked for resumption right away (no parked lease: the caller acquires it again).
-- Returns {'OK'} / {'RESUME'} (every call decided by kept signals), {'PARKED'} /
--      {'RESUMED'} (replayed: already parked with this fence; nothing written)
--      or {'UNKNOWN'|'APPLIED'|'STALE'|'NOT_HEAD'|'NOT_RUNNING'|'BAD_ARGS'} / {'CORRUPT', key}.
redis.replicate_commands()
local k, corrupt = turn_ending(1)
if corrupt then
  return corrupt
end
local lease, turn = k.lease, k.turn
local ok_p, pending = pcall(cjson.decode, ARGV[4])
local ok_w, waits = pcall(cjson.decode, ARGV[8])
if not (ok_p and ok_w and type(pending) == 'table' and type(waits) == 'table') then
  return {'BAD_ARGS'}
end
local parks_as = 'waiting'
for _, id in ipairs(pending) do
  if type(waits[id]) ~= 'table' then
    parks_as = 'awaiting_approval'
  end
end
local r = redis.call('HMGET', turn, 'status', 'parked_fence', 'resume')
local l = redis.call('HMGET', lease, 'fence', 'state')
if l[1] == ARGV[2] and l[2] == 'parked' and PARKED[r[1]] then
  return {'PARKED'}
end
-- This park resumed the turn at once (kept signals decided every call): no lease left.
if r[2] == ARGV[2] and PARKED[r[1]] and r[3] == '1' then
  return {'RESUMED'}
end
local refused, where = guard_run(lease, k.inbox, turn, ARGV[1], ARGV[2], {running = true})
if refused then
  return {refused, where}
end
local now = now_ms()
-- The kept signals each signal wait takes: read (and checked) before the first write.
local taken, cursor, trims = {}, {}, {}
for _, id in ipairs(pending) do
  local w = waits[id]
  if type(w) == 'table' and w.on == 'signal' then
    local key = KEYS[tonumber(w.key) or 0]
    if not key then
      return {'BAD_ARGS'}
    end
    local kept = touch(key, 'LRANGE', key, 0, -1)
    if kept == nil then
      return {'CORRUPT', key}
    end
    local i = cursor[key] or 1
    while kept[i] do
      local ok_e, entry = pcall(cjson.decode, kept[i])
      i = i + 1
      if ok_e and type(entry) == 'table' and tonumber(entry.exp_ms or 0) > now then
        taken[id] = entry
        break
      end
    end
    cursor[key] = i
    trims[key] = i - 1
  end
end
local ok, old = pcall(cjson.decode, redis.call('HGET', turn, 'pending') or '[]')
if ok and type(old) == 'table' then
  for _, id in ipairs(old) do
    redis.call('HDEL', turn, 'decision:' .. id)
  end
end
emit_batch(k.events, ARGV[7], 10, tonumber(ARGV[9]))
redis.call('SET', k.cont, ARGV[3])
redis.call('DEL', k.journal)
redis.call('HSET', turn, 'status', parks_as, 'result', ARGV[5], 'pending', ARGV[4],
  'waits', ARGV[8], 'resume', '0', 'parked_ms', istr(now))
emit(k.events, ARGV[7], 'status', status_data(parks_as))
local decided = 0
for _, id in ipairs(pending) do
  local entry = taken[id]
  if entry then
    decided = decided + 1
    redis.call('HSET', turn, 'decision:' .. id, cjson.encode({approved = true,
      by = entry.by, at_ms = now, expired = false, result = entry.payload, is_error = false}))
    emit(k.events, ARGV[7], 'signal_delivered', cjson.encode({call_id = id,
      signal = waits[id].name, id = entry.id, by = entry.by, sent_ms = entry.at_ms,
      at_ms = now}))
  end
end
for key, n in pairs(trims) do
  if n > 0 then
    redis.call('LTRIM', key, n, -1)
  end
end
if decided == #pending then
  redis.call('HSET', turn, 'resume', '1', 'parked_fence', ARGV[2])
  redis.call('DEL', lease)
  return {'RESUME'}
end
redis.call('HSET', lease, 'state', 'parked', 'expires_ms', istr(now + tonumber(ARGV[6])))
redis.call('PEXPIRE', lease, ARGV[6])
return {'OK'}
