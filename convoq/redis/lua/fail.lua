-- KEYS[1] = inbox     {prefix}:{cid}:inbox
-- KEYS[2] = lease     {prefix}:{cid}:lease
-- KEYS[3] = turn      {prefix}:{cid}:turn:{tid}
-- KEYS[4] = journal   {prefix}:{cid}:journal:{tid}
-- KEYS[5] = cont      {prefix}:{cid}:cont:{tid}
-- KEYS[6] = events    {prefix}:{cid}:events:{tid}
-- KEYS[7] = meta      {prefix}:{cid}:meta                   (KEYS[7..14] only with ARGV[5])
-- KEYS[8] = turns     {prefix}:{cid}:turns
-- KEYS[9] = blobs     {prefix}:{cid}:blobs
-- KEYS[10] = lead     {prefix}:{cid}:lead
-- KEYS[11] = turn     {prefix}:{cid}:turn:{next tid}
-- KEYS[12] = journal  {prefix}:{cid}:journal:{next tid}
-- KEYS[13] = cont     {prefix}:{cid}:cont:{next tid}
-- KEYS[14] = events   {prefix}:{cid}:events:{next tid}
-- ARGV[1] = turn id
-- ARGV[2] = fence
-- ARGV[3] = error JSON {type, message, details}
-- ARGV[4] = final status: 'failed', 'cancelled' or 'blocked' (a guardrail tripped)
-- ARGV[5] = next tid: the turn the caller expects next (acquire's peek), '' = none
-- ARGV[6 .. 13] = take_options(): turn ttl ms, events MAXLEN, lease ms (hand-off), history
--                 windows by agent (turn_window()), max attempts, error JSON over max
--                 attempts, max cut-offs, error JSON over max cut-offs
-- ARGV[14] = n: events the turn emitted since its last write
-- ARGV[15 .. 14+2n] = type, data, type, data, ... (appended before "done")
-- Ends the head turn without storing anything in history; guards as commit (a queued
-- head may be failed too: a handed-off turn that could not be loaded), hand-off as commit.
-- A failed turn keeps its journal (with its record's TTL) for a retry (retry.lua); a
-- cancelled one does not.
-- Returns as commit, or {'UNKNOWN'|'APPLIED'|'STALE'|'NOT_HEAD'|'NOT_RUNNING'} /
--         {'CORRUPT', key}.
redis.replicate_commands()
local k, corrupt = turn_ending(1)
if corrupt then
  return corrupt
end
local tid, o = ARGV[1], take_options(6)
local refused, where, ahead = guard_run(k.lease, k.inbox, k.turn, tid, ARGV[2],
  {running = true, queued = true}, 2)
if refused then
  return {refused, where}
end
k.cancel = where
k.saved = ahead.saved
local now = now_ms()
k.last = ahead.last
finish(k, tid, ARGV[4], 'error', ARGV[3], o.ttl, o.maxlen, now, 15, tonumber(ARGV[14]))
local h = {meta = KEYS[7], turns = KEYS[8], blobs = KEYS[9], lead = KEYS[10]}
return hand_over(h, k, ARGV[5], turn_keys(k.inbox, k.lease, 11), o, now, ahead)
