-- KEYS[1] = meta      {prefix}:{cid}:meta
-- KEYS[2] = turns     {prefix}:{cid}:turns
-- KEYS[3] = blobs     {prefix}:{cid}:blobs
-- KEYS[4] = lead      {prefix}:{cid}:lead
-- KEYS[5] = applied   {prefix}:{cid}:append:{append id}
-- KEYS[6] = lease     {prefix}:{cid}:lease
-- ARGV[1] = how long the append id is remembered, ms (longer than any resend takes)
-- ARGV[2] = fence of the lease the writer holds, or '' (a plain memory append)
-- ARGV[3] = element of leading system/developer messages, or ''
-- ARGV[4] = element of messages before the first user message (not system/developer), or ''
-- ARGV[5] = usage JSON {meta field: tokens to add}: what the messages' model calls reported,
--           summed into the conversation's counters ('{}': nothing reported)
-- ARGV[6] = n: how many user-led turn elements follow
-- ARGV[7 .. 6+n] = the turn elements
-- ARGV[7+n ..] = sha256, bytes, sha256, bytes, ... (attachments)
-- Appends messages to a conversation's history (memory API). When the history has no turn
-- yet, ARGV[3] joins the lead list; otherwise ARGV[3] and ARGV[4] continue the last turn.
-- Exactly once per append id: a resend (the reply was lost) finds the id and writes
-- nothing. With a fence, only the lease's current holder appends, and the lease is freed
-- in the same step (the in-process writer's turn ends here).
-- Returns {'OK', turns stored} / {'APPLIED'} (a resend: already stored) / {'STALE'} (the
-- lease moved on) or {'VERSION', v} / {'CORRUPT', key} (nothing written).
local meta, turns, blobs, lead = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local applied, lease = KEYS[5], KEYS[6]
if redis.call('EXISTS', applied) == 1 then
  return {'APPLIED'}
end
if ARGV[2] ~= '' then
  local l = redis.call('HMGET', lease, 'fence', 'state')
  if l[1] ~= ARGV[2] or l[2] ~= 'active' then
    return {'STALE'}
  end
end
local bad = bad_version(meta)
if bad then
  return {'VERSION', bad}
end
local usage = cjson.decode(ARGV[5])
local counters = {'turns', 'bytes'}
for field in pairs(usage) do
  counters[#counters + 1] = field
end
local corrupt = wrong_type('list', {turns, lead}) or wrong_type('hash', {blobs})
  or bad_counters(meta, unpack(counters))
if corrupt then
  return {'CORRUPT', corrupt}
end
local n = tonumber(ARGV[6])
local empty = redis.call('LLEN', turns) == 0
local starts, size = n, 0
if ARGV[3] ~= '' then
  size = size + string.len(ARGV[3])
  if empty then
    redis.call('RPUSH', lead, ARGV[3])
  else
    redis.call('RPUSH', turns, ARGV[3])
  end
end
if ARGV[4] ~= '' then
  size = size + string.len(ARGV[4])
  redis.call('RPUSH', turns, ARGV[4])
  if empty then
    starts = starts + 1
  end
end
for i = 7, 6 + n do
  size = size + string.len(ARGV[i])
  redis.call('RPUSH', turns, ARGV[i])
end
size = size + store_blobs(blobs, 7 + n)
redis.call('HSETNX', meta, 'format_version', FORMAT)
local bytes = redis.call('HINCRBY', meta, 'bytes', size)
-- Meta's `lead`: '1' once a lead element is stored, '0' while the lead list is empty (set
-- by the first write of a history: here, or commit's); absent on conversations stored
-- before it existed. A turn's window then reads the lead list only when it may hold one.
if ARGV[3] ~= '' and empty then
  redis.call('HSET', meta, 'lead', '1')
elseif bytes == size then  -- nothing was stored before: the lead list is empty
  redis.call('HSET', meta, 'lead', '0')
end
for field, count in pairs(usage) do
  redis.call('HINCRBY', meta, field, istr(count))
end
local total = redis.call('HINCRBY', meta, 'turns', starts)
redis.call('SET', applied, '1', 'PX', ARGV[1])
if ARGV[2] ~= '' then
  redis.call('DEL', lease)
end
return {'OK', total}
