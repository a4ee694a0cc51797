-- KEYS[1] = meta      {prefix}:{cid}:meta
-- KEYS[2] = turns     {prefix}:{cid}:turns
-- KEYS[3] = blobs     {prefix}:{cid}:blobs
-- KEYS[4] = inbox     {prefix}:{cid}:inbox
-- KEYS[5] = lease     {prefix}:{cid}:lease
-- KEYS[6] = turn      {prefix}:{cid}:turn:{tid}
-- KEYS[7] = journal   {prefix}:{cid}:journal:{tid}
-- KEYS[8] = cont      {prefix}:{cid}:cont:{tid}
-- KEYS[9] = events    {prefix}:{cid}:events:{tid}
-- ARGV[1] = turn id
-- ARGV[2] = fence
-- ARGV[3] = the turn element (JSON, attachments as blob refs)
-- ARGV[4] = result JSON {"text", "messages"}
-- ARGV[5] = turn ttl ms
-- ARGV[6] = events stream MAXLEN (approximate)
-- ARGV[7] = lease ms (for the hand-off to the next turn)
-- ARGV[8] = '1': refuse when a cancel was requested (the runner then fails the turn as
--           cancelled); '0': commit anyway
-- ARGV[9] = n: events the turn emitted since its last write
-- ARGV[10 .. 9+2n] = type, data, type, data, ... (appended before "done")
-- ARGV[10+2n ..] = sha256, bytes, sha256, bytes, ... (attachments of the turn)
-- Appends the turn exactly once: only for the current fence, the inbox head, a running
-- turn. Then keeps the lease (same fence) if more turns wait, else frees it.
-- Returns {'OK', next turn id or false}
--      or {'UNKNOWN'|'APPLIED'|'STALE'|'NOT_HEAD'|'NOT_RUNNING'|'CANCELLED'} / {'VERSION', v}
--      or {'CORRUPT', key} (a key it writes holds the wrong type; nothing written).
redis.replicate_commands()
local meta, turns, blobs = KEYS[1], KEYS[2], KEYS[3]
local k, corrupt = turn_ending(4)
if corrupt then
  return corrupt
end
local tid = ARGV[1]
local refused = guard_run(k.lease, k.inbox, k.turn, tid, ARGV[2], {running = true})
if refused then
  return {refused}
end
if ARGV[8] == '1' and cancel_requested(k.turn) then
  return {'CANCELLED'}
end
local bad = bad_version(meta)
if bad then
  return {'VERSION', bad}
end
local bad_key = wrong_type('list', {turns}) or wrong_type('hash', {blobs})
  or bad_counters(meta, 'turns', 'bytes')
if bad_key then
  return {'CORRUPT', bad_key}
end
local n = tonumber(ARGV[9])
local now = now_ms()
local added = store_blobs(blobs, 10 + 2 * n)
emit_batch(k.events, ARGV[6], 10, n)
redis.call('RPUSH', turns, ARGV[3])
redis.call('HSETNX', meta, 'format_version', '1')
redis.call('HINCRBY', meta, 'turns', 1)
redis.call('HINCRBY', meta, 'bytes', string.len(ARGV[3]) + added)
redis.call('HSET', meta, 'last_turn_id', tid)
finish(k, tid, 'succeeded', 'result', ARGV[4], ARGV[5], ARGV[6], now)
return {'OK', hand_off(k.lease, k.inbox, ARGV[7], now)}
