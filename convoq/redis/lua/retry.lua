-- KEYS[1] = meta      {prefix}:{cid}:meta
-- KEYS[2] = inbox     {prefix}:{cid}:inbox
-- KEYS[3] = turn      {prefix}:{cid}:turn:{tid}
-- KEYS[4] = journal   {prefix}:{cid}:journal:{tid}
-- KEYS[5] = cont      {prefix}:{cid}:cont:{tid}
-- KEYS[6] = events    {prefix}:{cid}:events:{tid}
-- ARGV[1] = turn id
-- ARGV[2] = retry token: the same for a resend of one request, another for each request
-- ARGV[3] = events stream MAXLEN (approximate)
-- ARGV[4] = the most turns the inbox may hold (0: no limit)
-- Puts a failed turn back in line as the same turn: at the back of its conversation's
-- inbox (the turns submitted after it ran meanwhile), status queued again, its error and
-- times cleared, its budgets of crashed and cut-off runs afresh (runs, cut_offs; a report
-- of a run from before is ignored: cut_fence is the conversation's fence now), its
-- attempts counted on. Its journal and continuation (kept by finish() for a failed turn)
-- stay, and lose their TTL as the record and its events do: the next run replays the
-- finished steps, its tools keep their idempotency keys. Appends "retried" ({"retry": n})
-- and the "queued" status to its events.
-- A resend of a request (its token is the last retry's) changes nothing: {'REPEATED'}.
-- Returns {'OK', position (0: nothing queued before it), retries, event id, agent}
--      or {'REPEATED', status, retries, agent} / {'NOT_FAILED', status} / {'UNKNOWN'}
--      (agent: the one the record names, false for none: the pool its kick goes to)
--      or {'FULL', waiting} / {'VERSION', v} / {'CORRUPT', key} (nothing written).
redis.replicate_commands()
local meta, inbox, turn, journal, cont, events = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5],
  KEYS[6]
local tid, token = ARGV[1], ARGV[2]
local bad = wrong_type('hash', {turn}) or wrong_type('list', {inbox})
  or wrong_type('string', {journal, cont}) or wrong_type('stream', {events})
  or bad_counters(turn, 'retries')
if bad then
  return {'CORRUPT', bad}
end
local rec = redis.call('HMGET', turn, 'status', 'retry_token', 'retries', 'last_event', 'agent')
local status = rec[1]
if not status then
  return {'UNKNOWN'}
end
local retries = tonumber(rec[3] or '0')
if rec[2] == token then
  return {'REPEATED', status, istr(retries), rec[5] or false}
end
if status ~= 'failed' then
  return {'NOT_FAILED', status}
end
local refusal = meta_refusal(meta)
if refusal then
  return refusal
end
local waiting = redis.call('LLEN', inbox)
local max_waiting = tonumber(ARGV[4] or '0')
if max_waiting > 0 and waiting >= max_waiting then
  return {'FULL', waiting}
end
retries = retries + 1
local queued = {{'retried', '{"retry":' .. istr(retries) .. '}'},
  {'status', status_data('queued')}}
local id = emit_events(events, ARGV[3], queued, now_ms(), rec[4])
redis.call('RPUSH', inbox, tid)
redis.call('HDEL', turn, 'error', 'result', 'started_ms', 'finished_ms', 'cancel',
  'expired_ms', 'handed_back', 'cut_off', 'stop', 'stopped_by')
redis.call('HSET', turn, 'status', 'queued', 'retries', istr(retries), 'retry_token', token,
  'runs', '0', 'cut_offs', '0', 'cut_fence', fences[meta] or '0', 'last_event', id)
redis.call('PERSIST', turn)
redis.call('PERSIST', events)
redis.call('PERSIST', journal)
redis.call('PERSIST', cont)
return {'OK', waiting, istr(retries), id, rec[5] or false}
