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
-- ARGV[3] = hand-off fence: the caller's lease from commit/fail ('0' = none)
-- ARGV[4 .. 11] = take_options(): turn ttl ms, events MAXLEN, lease ms, history windows by
--                 agent (turn_window()), max attempts, error JSON over max attempts, max
--                 cut-offs, error JSON over max cut-offs
-- Takes the lease (a new fence, or the handed-off one) and hands out the head turn with
-- its history window, in one round trip (take_head() in _lib.lua, shared with commit and
-- fail, which hand out the next turn the same way).
-- Returns {'OK', fence, turn record as field/value list, 'journal'|'cont'|false,
--          state JSON or false, lead elements, window elements, {sha, bytes, ...},
--          id of the turn queued behind it or false, window in turns,
--          '1' when the conversation has a stored summary else '0'}
--      or {'EMPTY'} (nothing queued; a handed-off lease is freed) / {'BUSY'} (lease live,
--         or the head is parked undecided)
--      or {'RETRY', head, failed}: the head is another turn (or the head was just failed
--         over max attempts): call again with that turn's keys
--      or {'VERSION', v} / {'CORRUPT', key}.
-- `failed` (in RETRY and EMPTY) is the id of the turn this call just ended as failed, or
-- false/absent: the caller owes that turn what any finished turn gets (its callback).
redis.replicate_commands()
local h = {meta = KEYS[1], turns = KEYS[2], blobs = KEYS[3], lead = KEYS[4]}
local k = turn_keys(KEYS[5], KEYS[6], 7)
local tid, o = ARGV[1], take_options(4)
-- `bytes` is read along: every write of history (commit, a memory append) counts its size
-- there, so a meta without it has no history to read (a new conversation: two reads less);
-- so is `lead`: '0' says the lead list is empty (a read less).
local refusal, counted = meta_refusal(h.meta, 'bytes', 'lead')
if refusal then
  return refusal
end
h.empty = not counted[1]
h.no_lead = counted[2] == '0'
-- First reads check their key's type (touch()): nothing is written before them.
local queue = touch(k.inbox, 'LRANGE', k.inbox, 0, 1)  -- the head and the peek behind it
if queue == nil then
  return {'CORRUPT', k.inbox}
end
local head = queue[1] or false
local l = touch(k.lease, 'HMGET', k.lease, 'fence', 'state', 'holder')
if l == nil then
  return {'CORRUPT', k.lease}
end
local mine = ARGV[3] ~= '0' and l[1] == ARGV[3] and l[2] == 'active'
if not head then
  if mine then
    redis.call('DEL', k.lease)
  end
  return {'EMPTY'}
end
if l[1] and not mine then
  return {'BUSY'}
end
if head ~= tid then
  return {'RETRY', head}
end
local holder = ARGV[2]
if holder == '' then
  holder = l[3] or ''
end
-- No TIME: the clock comes from the "running" event's id (take_head()).
local taken = take_head(h, k, tid, holder, mine and l[1], o, nil, queue[2] or false)
if taken[1] ~= 'DROPPED' then
  return taken
end
-- The head was dropped or failed: go on with the next one, or free a handed-off lease.
local nxt = redis.call('LINDEX', k.inbox, 0)
if nxt then
  return {'RETRY', nxt, taken[2]}
end
if mine then
  redis.call('DEL', k.lease)
end
return {'EMPTY', taken[2]}
