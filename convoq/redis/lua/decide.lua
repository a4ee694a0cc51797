-- KEYS[1] = lease     {prefix}:{cid}:lease
-- KEYS[2] = turn      {prefix}:{cid}:turn:{tid}
-- KEYS[3] = events    {prefix}:{cid}:events:{tid}
-- ARGV[1] = tool call id
-- ARGV[2] = decision JSON {"approved": bool, "reason": str|null, "by": str|null,
--           "expired": false[, "result": JSON text, "is_error": bool]}
-- ARGV[3] = events stream MAXLEN (approximate)
-- ARGV[4] = who decides: 'person' (an approval), 'child' (the call's child turn ended) or
--           'result' (a deferred call's result arrived); a call is decided only by what it
--           waits for (the turn's `waits`, see park.lua: a call not in it waits for a person)
-- Records a decision on a pending call of a parked turn, stamped with the server time
-- (at_ms), and emits it as a "decision" event (the audit trail: who, when, why). Once
-- every pending call is decided the parked lease is dropped and the turn is marked for
-- resumption: the next acquire hands it out with its continuation and the decisions.
-- The same decision again (verdict and reason; a client retrying after a lost reply, or
-- this script resent) writes nothing and answers KEPT_RESUME / KEPT_PENDING, as the first
-- did, even once a worker took the resumed turn: the caller sends no second resume.
-- The event is "decision", or "result_supplied" for a result.
-- Returns {'RESUME', agent} / {'PENDING'} (recorded) or {'KEPT_RESUME', agent} /
--      {'KEPT_PENDING'} (the same decision was recorded before: nothing written); agent:
--      the one the turn's record names (false: none), whose pool the resume kick goes to
--      or {'UNKNOWN'} / {'NOT_PARKED', status} / {'UNKNOWN_CALL', pending ids JSON}
--      or {'DECIDED'} (the call was decided otherwise) / {'EXPIRED'} (approval expired)
--      or {'CHILD_CALL'} / {'NOT_CHILD_CALL'} / {'WAITS_FOR', what it waits for} (the call
--         is not one this decider decides)
--      or {'CORRUPT', key} (nothing written).
redis.replicate_commands()
local lease, turn, events = KEYS[1], KEYS[2], KEYS[3]
local rec = redis.call('HMGET', turn, 'status', 'pending', 'resume', 'waits', 'agent')
if not rec[1] then
  return {'UNKNOWN'}
end
local field = 'decision:' .. ARGV[1]
local decision = cjson.decode(ARGV[2])
local ok_w, waits = pcall(cjson.decode, rec[4] or '{}')
if not ok_w or type(waits) ~= 'table' then
  return {'CORRUPT', turn}
end
local w = waits[ARGV[1]]
local waits_for = type(w) == 'table' and w.on or 'person'
if waits_for == 'child' and ARGV[4] ~= 'child' then
  return {'CHILD_CALL'}
elseif ARGV[4] == 'child' and waits_for ~= 'child' then
  return {'NOT_CHILD_CALL'}
end
local ok, pending = pcall(cjson.decode, rec[2] or '[]')
if not ok or type(pending) ~= 'table' then
  pending = {}
end
local known = false
for _, id in ipairs(pending) do
  if id == ARGV[1] then
    known = true
  end
end
if known and waits_for ~= ARGV[4] then
  return {'WAITS_FOR', waits_for}
end
-- A decision field only ever belongs to the calls the turn last parked on (park drops
-- the ones before), so one found is this call's, whatever the turn's status is now.
local previous = redis.call('HGET', turn, field)
if previous then
  local seen_ok, seen = pcall(cjson.decode, previous)
  if not seen_ok or type(seen) ~= 'table' then
    return {'CORRUPT', turn}
  end
  if seen.approved ~= decision.approved or seen.reason ~= decision.reason
      or seen.result ~= decision.result or (seen.is_error or false) ~= (decision.is_error or false) then
    return {'DECIDED'}
  end
  -- Every call was decided once the turn was marked for resumption or left the park.
  if rec[3] == '1' or not PARKED[rec[1]] then
    return {'KEPT_RESUME', rec[5] or false}
  end
  return {'KEPT_PENDING'}
end
if not PARKED[rec[1]] then
  return {'NOT_PARKED', rec[1]}
end
if not known then
  return {'UNKNOWN_CALL', rec[2] or '[]'}
end
if rec[3] ~= '1' and redis.call('HGET', lease, 'state') ~= 'parked' then
  return {'EXPIRED'}
end
-- Whether this decision is the last one missing, read before the first write.
local last = true
for _, id in ipairs(pending) do
  if id ~= ARGV[1] and redis.call('HEXISTS', turn, 'decision:' .. id) == 0 then
    last = false
  end
end
decision.at_ms = now_ms()
local stamped = cjson.encode(decision)
decision.call_id = ARGV[1]
-- The event is the first write: an events key of another type refuses the decision.
local etype = ARGV[4] == 'result' and 'result_supplied' or 'decision'
if not emit_first(events, ARGV[3], etype, cjson.encode(decision)) then
  return {'CORRUPT', events}
end
redis.call('HSET', turn, field, stamped)
if not last then
  return {'PENDING'}
end
if rec[3] ~= '1' then
  redis.call('HSET', turn, 'resume', '1')
  redis.call('DEL', lease)
end
return {'RESUME', rec[5] or false}
