-- KEYS[1] = meta      {prefix}:{cid}:meta
-- KEYS[2] = turns     {prefix}:{cid}:turns
-- KEYS[3] = blobs     {prefix}:{cid}:blobs
-- KEYS[4] = lead      {prefix}:{cid}:lead
-- ARGV[1] = element of leading system/developer messages, or ''
-- ARGV[2] = element of messages before the first user message (not system/developer), or ''
-- ARGV[3] = usage JSON {meta field: tokens to add}: what the messages' model calls reported,
--           summed into the conversation's counters ('{}': nothing reported)
-- ARGV[4] = n: how many user-led turn elements follow
-- ARGV[5 .. 4+n] = the turn elements
-- ARGV[5+n ..] = sha256, bytes, sha256, bytes, ... (attachments)
-- Appends messages to a conversation's history (memory API). When the history has no turn
-- yet, ARGV[1] joins the lead list; otherwise ARGV[1] and ARGV[2] continue the last turn.
-- Returns {'OK', turns stored} or {'VERSION', v} / {'CORRUPT', key} (nothing written).
local meta, turns, blobs, lead = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local bad = bad_version(meta)
if bad then
  return {'VERSION', bad}
end
local usage = cjson.decode(ARGV[3])
local counters = {'turns', 'bytes'}
for field in pairs(usage) do
  counters[#counters + 1] = field
end
local corrupt = wrong_type('list', {turns, lead}) or wrong_type('hash', {blobs})
  or bad_counters(meta, unpack(counters))
if corrupt then
  return {'CORRUPT', corrupt}
end
local n = tonumber(ARGV[4])
local empty = redis.call('LLEN', turns) == 0
local starts, size = n, 0
if ARGV[1] ~= '' then
  size = size + string.len(ARGV[1])
  if empty then
    redis.call('RPUSH', lead, ARGV[1])
  else
    redis.call('RPUSH', turns, ARGV[1])
  end
end
if ARGV[2] ~= '' then
  size = size + string.len(ARGV[2])
  redis.call('RPUSH', turns, ARGV[2])
  if empty then
    starts = starts + 1
  end
end
for i = 5, 4 + n do
  size = size + string.len(ARGV[i])
  redis.call('RPUSH', turns, ARGV[i])
end
size = size + store_blobs(blobs, 5 + n)
redis.call('HSETNX', meta, 'format_version', FORMAT)
redis.call('HINCRBY', meta, 'bytes', size)
for field, count in pairs(usage) do
  redis.call('HINCRBY', meta, field, istr(count))
end
local total = redis.call('HINCRBY', meta, 'turns', starts)
return {'OK', total}
