-- KEYS[1] = meta      {prefix}:{cid}:meta
-- KEYS[2] = turns     {prefix}:{cid}:turns
-- KEYS[3] = blobs     {prefix}:{cid}:blobs
-- KEYS[4] = lead      {prefix}:{cid}:lead
-- KEYS[5] = inbox     {prefix}:{cid}:inbox
-- KEYS[6] = lease     {prefix}:{cid}:lease
-- KEYS[7] = turn      {prefix}:{cid}:turn:{tid}
-- KEYS[8] = journal   {prefix}:{cid}:journal:{tid}
-- KEYS[9] = cont      {prefix}:{cid}:cont:{tid}
-- KEYS[10] = events   {prefix}:{cid}:events:{tid}
-- ARGV[1] = tid: the turn id the caller saw at the inbox head (its keys are KEYS[7..10])
-- ARGV[2] = worker id ('' keeps the holder of a handed-off lease)
-- ARGV[3] = lease ms
-- ARGV[4] = history window in turns (0 = all)
-- ARGV[5] = max attempts
-- ARGV[6] = hand-off fence: the caller's lease from commit/fail ('0' = none)
-- ARGV[7] = turn ttl ms (records of turns failed here)
-- ARGV[8] = events stream MAXLEN (approximate)
-- ARGV[9] = error JSON for a turn over max attempts
-- ARGV[10] = error JSON for a parked turn whose approval expired
-- Takes the lease (a new fence, or the handed-off one) and hands out the head turn with
-- its history window, in one round trip.
-- Returns {'OK', fence, turn record as field/value list, 'journal'|'cont'|false,
--          state JSON or false, lead elements, window elements, {sha, bytes, ...}}
--      or {'EMPTY'} (nothing queued; a handed-off lease is freed) / {'BUSY'} (lease live,
--         or the head is parked undecided)
--      or {'RETRY', head, failed}: the head is another turn (or the head was just failed
--         over max attempts / approval expiry): call again with that turn's keys
--      or {'VERSION', v} / {'CORRUPT', key}.
-- `failed` (in RETRY and EMPTY) is the id of the turn this call just ended as failed, or
-- false/absent: the caller owes that turn what any finished turn gets (its callback).
redis.replicate_commands()
local meta, turns, blobs, lead = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local inbox, lease, turn = KEYS[5], KEYS[6], KEYS[7]
local k = {inbox = inbox, turn = turn, journal = KEYS[8], cont = KEYS[9], events = KEYS[10]}
local tid = ARGV[1]
local bad = bad_version(meta)
if bad then
  return {'VERSION', bad}
end
local head = redis.call('LINDEX', inbox, 0)
local l = redis.call('HMGET', lease, 'fence', 'state', 'holder')
local mine = ARGV[6] ~= '0' and l[1] == ARGV[6] and l[2] == 'active'
if not head then
  if mine then
    redis.call('DEL', lease)
  end
  return {'EMPTY'}
end
if l[1] and not mine then
  return {'BUSY'}
end
if head ~= tid then
  return {'RETRY', head}
end
-- After dropping or failing the head: go on with the next one, or free a handed-off lease.
-- `failed`: the id of the head if it was just failed here, else false.
local function next_head(failed)
  local nxt = redis.call('LINDEX', inbox, 0)
  if nxt then
    return {'RETRY', nxt, failed}
  end
  if mine then
    redis.call('DEL', lease)
  end
  return {'EMPTY', failed}
end
local now = now_ms()
local rec = redis.call('HMGET', turn, 'status', 'runs', 'resume')
local status = rec[1]
if not status or TERMINAL[status] then
  -- An inbox entry without a live record cannot run; drop it and go on.
  redis.call('LREM', inbox, 1, tid)
  return next_head(false)
end
if status == 'awaiting_approval' and rec[3] ~= '1' then
  -- Parked, undecided and the parked lease is gone: the approval expired.
  finish(k, tid, 'failed', 'error', ARGV[10], ARGV[7], ARGV[8], now)
  return next_head(tid)
end
local runs = tonumber(rec[2] or '0') + 1
if runs > tonumber(ARGV[5]) then
  finish(k, tid, 'failed', 'error', ARGV[9], ARGV[7], ARGV[8], now)
  return next_head(tid)
end
-- All reads that can fail come before the first write.
local win, corrupt = load_window(lead, turns, blobs, tonumber(ARGV[4]))
if not win then
  return {'CORRUPT', corrupt}
end
-- A journal is newer than a continuation (park deletes the journal).
local state_kind, state = 'journal', redis.call('GET', k.journal)
if not state then
  state_kind, state = 'cont', redis.call('GET', k.cont)
end
if not state then
  state_kind = false
end
local fence = l[1]
if not mine then
  if not redis.call('HGET', meta, 'fence') then
    -- Seed with the server time in microseconds so fences keep increasing even after
    -- the conversation was cleared (and its meta with the counter deleted).
    local t = redis.call('TIME')
    redis.call('HSET', meta, 'fence', t[1] .. string.format('%06d', tonumber(t[2])))
  end
  fence = istr(redis.call('HINCRBY', meta, 'fence', 1))
end
local holder = ARGV[2]
if holder == '' then
  holder = l[3] or ''
end
redis.call('HSET', lease, 'holder', holder, 'fence', fence, 'state', 'active',
  'expires_ms', istr(now + tonumber(ARGV[3])))
redis.call('PEXPIRE', lease, ARGV[3])
redis.call('HSETNX', meta, 'format_version', '1')
redis.call('HINCRBY', turn, 'attempts', 1)
redis.call('HSET', turn, 'runs', istr(runs), 'status', 'running')
redis.call('HSETNX', turn, 'started_ms', istr(now))
if status == 'awaiting_approval' then
  redis.call('HDEL', turn, 'result')  -- the pending approvals are decided now
end
if status ~= 'running' then
  emit(k.events, ARGV[8], 'status', status_data('running'))
end
return {'OK', fence, redis.call('HGETALL', turn), state_kind, state, win[1], win[2], win[3]}
