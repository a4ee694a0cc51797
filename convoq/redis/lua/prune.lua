-- KEYS[1] = meta      {prefix}:{cid}:meta
-- KEYS[2] = turns     {prefix}:{cid}:turns
-- KEYS[3] = blobs     {prefix}:{cid}:blobs
-- KEYS[4] = lead      {prefix}:{cid}:lead
-- KEYS[5] = inbox     {prefix}:{cid}:inbox
-- KEYS[6] = lease     {prefix}:{cid}:lease
-- KEYS[7] = summary   {prefix}:{cid}:summary
-- ARGV[1] = keep: the newest whole turns to keep (0 drops every turn)
-- Drops the older turns of a conversation and the blobs no kept element refers to; the
-- lead list and the summary stay (its watermark moves down by the turns dropped). Refused while a turn is queued,
-- running or parked. Reads every kept element's header (to find turn starts and blob
-- refs), never a body.
-- Returns {'OK', turns dropped} or {'BUSY'} / {'VERSION', v} / {'CORRUPT', key}.
local meta, turns, blobs, lead, inbox, lease = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local summary = KEYS[7]
local bad = bad_version(meta)
if bad then
  return {'VERSION', bad}
end
if redis.call('LLEN', inbox) > 0 or redis.call('EXISTS', lease) == 1 then
  return {'BUSY'}
end
local corrupt = wrong_type('list', {turns, lead}) or wrong_type('hash', {blobs, summary})
  or bad_counters(summary, 'watermark')
  or bad_counters(meta, 'turns', 'bytes')
if corrupt then
  return {'CORRUPT', corrupt}
end
local keep = tonumber(ARGV[1])
local all = redis.call('LRANGE', turns, 0, -1)
local first, starts = #all + 1, 0
for i = #all, 1, -1 do
  if starts >= keep then
    break
  end
  local kind = element_header(all[i])
  if not kind then
    return {'CORRUPT', turns}
  end
  first = i
  if kind == 'T' or i == 1 then
    starts = starts + 1
  end
end
local refs, seen = {}, {}
for _, raw in ipairs(redis.call('LRANGE', lead, 0, -1)) do
  local kind, header = element_header(raw)
  if not kind then
    return {'CORRUPT', lead}
  end
  add_refs(refs, seen, header)
end
local dropped_turns, dropped_bytes = 0, 0
for i = 1, #all do
  local kind, header = element_header(all[i])
  if not kind then
    return {'CORRUPT', turns}
  end
  if i >= first then
    add_refs(refs, seen, header)
  else
    dropped_bytes = dropped_bytes + string.len(all[i])
    if kind == 'T' or i == 1 then
      dropped_turns = dropped_turns + 1
    end
  end
end
-- Checks done; only writes that cannot fail from here on.
if first > #all then
  redis.call('DEL', turns)
else
  redis.call('LTRIM', turns, first - 1, -1)
end
local stale = {}
for _, sha in ipairs(redis.call('HKEYS', blobs)) do
  if not seen[sha] then
    stale[#stale + 1] = sha
    dropped_bytes = dropped_bytes + redis.call('HSTRLEN', blobs, sha)
  end
end
for i = 1, #stale, 500 do
  redis.call('HDEL', blobs, unpack(stale, i, math.min(i + 499, #stale)))
end
if redis.call('EXISTS', meta) == 1 then
  redis.call('HINCRBY', meta, 'turns', istr(-dropped_turns))
  redis.call('HINCRBY', meta, 'bytes', istr(-dropped_bytes))
end
local watermark = redis.call('HGET', summary, 'watermark')
if watermark then
  redis.call('HSET', summary, 'watermark', istr(math.max(0, tonumber(watermark) - dropped_turns)))
end
return {'OK', dropped_turns}
