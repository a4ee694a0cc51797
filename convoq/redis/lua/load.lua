-- KEYS[1] = meta      {prefix}:{cid}:meta
-- KEYS[2] = turns     {prefix}:{cid}:turns
-- KEYS[3] = blobs     {prefix}:{cid}:blobs
-- KEYS[4] = lead      {prefix}:{cid}:lead
-- ARGV[1] = window: the last N turns to return (0 = all)
-- A window longer than INLINE_MAX elements comes back as false: the client reads it in
-- chunks.
-- Returns {'OK', lead elements, window elements or false, {sha, bytes, ...}}
--      or {'VERSION', v} / {'CORRUPT', key}. Read only.
local meta, turns, blobs, lead = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local bad = bad_version(meta)
if bad then
  return {'VERSION', bad}
end
local win, corrupt = load_window(lead, turns, blobs, tonumber(ARGV[1]))
if not win then
  return {'CORRUPT', corrupt}
end
return {'OK', win[1], win[2], win[3]}
