-- KEYS[1] = meta      {prefix}:{cid}:meta
-- KEYS[2] = turns     {prefix}:{cid}:turns
-- KEYS[3] = blobs     {prefix}:{cid}:blobs
-- KEYS[4] = inbox     {prefix}:{cid}:inbox
-- KEYS[5] = lease     {prefix}:{cid}:lease
-- KEYS[6] = turn      {prefix}:{cid}:turn:{tid}
-- KEYS[7] = journal   {prefix}:{cid}:journal:{tid}
-- KEYS[8] = cont      {prefix}:{cid}:cont:{tid}
-- KEYS[9] = events    {prefix}:{cid}:events:{tid}
-- KEYS[10] = lead     {prefix}:{cid}:lead                   (only with ARGV[7])
-- KEYS[11] = turn     {prefix}:{cid}:turn:{next tid}        (only with ARGV[7])
-- KEYS[12] = journal  {prefix}:{cid}:journal:{next tid}     (only with ARGV[7])
-- KEYS[13] = cont     {prefix}:{cid}:cont:{next tid}        (only with ARGV[7])
-- KEYS[14] = events   {prefix}:{cid}:events:{next tid}      (only with ARGV[7])
-- ARGV[1] = turn id
-- ARGV[2] = fence
-- ARGV[3] = the turn element (JSON, attachments as blob refs)
-- ARGV[4] = result JSON {"text", "messages"}
-- ARGV[5] = '1': refuse when a cancel was requested (the runner then fails the turn as
--           cancelled); '0': commit anyway
-- ARGV[6] = the turn's final status: 'succeeded', or 'expired' (its approval expired and
--           its tool results say so; it is stored all the same), or 'interrupted' (a newer
--           message stopped it: its finished steps are stored)
-- ARGV[7] = next tid: the turn the caller expects next (acquire's peek), '' = none
-- ARGV[8 .. 15] = take_options(): turn ttl ms, events MAXLEN, lease ms (hand-off), history
--                 windows by agent (turn_window()), max attempts, error JSON over max
--                 attempts, max cut-offs, error JSON over max cut-offs
-- ARGV[16] = usage JSON {meta field: tokens to add}: the turn's reported usage, summed into
--           the conversation's counters ('{}': nothing reported)
-- ARGV[17] = n: events the turn emitted since its last write
-- ARGV[18 .. 17+2n] = type, data, type, data, ... (appended before "done")
-- ARGV[18+2n ..] = sha256, bytes, sha256, bytes, ... (attachments of the turn)
-- Appends the turn exactly once: only for the current fence, the inbox head, a running
-- turn. Then the hand-off (hand_over() in _lib.lua): the lease is freed when no turn
-- waits, else kept with the same fence for the next one. When that next turn is the one
-- named in ARGV[7] (whose keys came along), it is handed out right here, as acquire would
-- do it (attempts, approval expiry, status running, its history window, its saved state
-- and the peek behind it): a busy conversation costs one round trip per turn. When it is
-- another (the expected one was cancelled meanwhile, or none was expected because it
-- arrived later) only its id comes back and the caller acquires it with the kept fence.
-- Returns {'OK', false[, failed]} (lease freed) / {'OK', next tid, failed or false}
--         (acquire it) / {'OK', next tid, false, acquire's reply for it}
--      or {'UNKNOWN'|'APPLIED'|'STALE'|'NOT_HEAD'|'NOT_RUNNING'|'CANCELLED'} / {'VERSION', v}
--      or {'CORRUPT', key} (a key it writes holds the wrong type; nothing written).
redis.replicate_commands()
local h = {meta = KEYS[1], turns = KEYS[2], blobs = KEYS[3], lead = KEYS[10]}
-- Keys are checked by their first read (guard_run, meta_refusal) or, for the history list
-- and the events, by their first write (the RPUSH, finish()); the others before any write.
local k = turn_keys(KEYS[4], KEYS[5], 6)
local tid, o = ARGV[1], take_options(8)
-- The inbox read two entries past the head: the next head and the peek behind it.
local refused, where, ahead = guard_run(k.lease, k.inbox, k.turn, tid, ARGV[2],
  {running = true}, 2)
if refused then
  return {refused, where}
end
if ARGV[5] == '1' and where then  -- a cancel was requested
  return {'CANCELLED'}
end
k.cancel = where
local usage = cjson.decode(ARGV[16])
local counters = {'turns', 'bytes'}
for field in pairs(usage) do
  counters[#counters + 1] = field
end
-- The counters are read with the format check: the new values are written in one HSET.
-- And `lead` after them: see append.lua.
local wanted = {unpack(counters)}
wanted[#wanted + 1] = 'lead'
local refusal, values = meta_refusal(h.meta, unpack(wanted))
if refusal then
  return refusal
end
local n = tonumber(ARGV[17])
local has_blobs = #ARGV >= 18 + 2 * n
local bad_key = has_blobs and wrong_type('hash', {h.blobs})
for i = 1, #counters do
  if not counter_ok(values[i]) then
    bad_key = bad_key or h.meta  -- HINCRBY would fail on it
  end
end
if bad_key then
  return {'CORRUPT', bad_key}
end
local now = now_ms()
local status = (ARGV[6] == 'expired' or ARGV[6] == 'interrupted') and ARGV[6] or 'succeeded'
-- The first write checks the history list's type (no TYPE call); the events check theirs
-- by the next one, which takes the push back when it is refused: nothing stays written.
if touch(h.turns, 'RPUSH', h.turns, ARGV[3]) == nil then
  return {'CORRUPT', h.turns}
end
k.last = ahead.last
k.saved = ahead.saved
if not finish(k, tid, status, 'result', ARGV[4], o.ttl, o.maxlen, now, 18, n, ahead.run) then
  redis.call('RPOP', h.turns)
  return {'CORRUPT', k.events}
end
local added = store_blobs(h.blobs, 18 + 2 * n)
local function plus(i, count)
  return istr(tonumber(values[i] or '0') + count)
end
local fields = {'turns', plus(1, 1), 'bytes', plus(2, string.len(ARGV[3]) + added),
  'last_turn_id', tid}
for i = 3, #counters do
  fields[#fields + 1] = counters[i]
  fields[#fields + 1] = plus(i, tonumber(usage[counters[i]]))
end
local lead = values[#counters + 1]
if not values[2] and not lead then
  -- No history before this turn, so no lead either: said once, read by every acquire.
  fields[#fields + 1] = 'lead'
  fields[#fields + 1] = '0'
end
h.no_lead = lead == '0' or (not values[2] and not lead)
if not stamped[h.meta] then
  fields[#fields + 1] = 'format_version'
  fields[#fields + 1] = FORMAT
  stamped[h.meta] = true
end
redis.call('HSET', h.meta, unpack(fields))
return hand_over(h, k, ARGV[7], turn_keys(k.inbox, k.lease, 11), o, now, ahead)
