-- KEYS[1] = meta      {prefix}:{cid}:meta
-- KEYS[2] = turns     {prefix}:{cid}:turns
-- KEYS[3] = lead      {prefix}:{cid}:lead
-- KEYS[4] = summary   {prefix}:{cid}:summary
-- KEYS[5] = blobs     {prefix}:{cid}:blobs
-- ARGV[1] = budget: tokens the lead plus the kept turns may take
-- ARGV[2] = keep: at most this many turns (0 = no limit)
-- ARGV[3] = stop: index of the newest element still to look at; -1 on the first call (the
--           list's end; the lead is counted then)
-- ARGV[4] = tokens used so far (by the lead and the turns kept by earlier calls)
-- ARGV[5] = turns kept so far
-- ARGV[6] = last index (from the first call's reply; '' on the first call)
-- ARGV[7] = '1': what a turn sends, so a summary replaces the turns it covers (its
--           watermark caps keep, its text counts against the budget); first call only
-- Chooses a token-budget window from element headers alone (their ' w=N' field: what the
-- default token counter made of the element when it was stored; an element without one
-- counts a token per 4 bytes). Reads at most about SCAN_MAX elements per call, stopping at
-- a turn boundary, so a huge budget never blocks Redis for long.
-- Returns {'DONE', first index of the window, last index, summary text or false[, lead
--          elements, window elements, {sha, bytes, ...}]} (first > last: no turn fits;
--          the elements come along when a first call read at most INLINE_MAX of them)
--      or {'MORE', next stop, tokens used, turns kept, last index, keep, summary text or
--          false}: call again with these
--      or {'VERSION', v} / {'CORRUPT', key}. Read only.
local meta, turns, lead, summary, blobs = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5]
local SCAN_MAX = 2048
local bad = bad_version(meta)
if bad then
  return {'VERSION', bad}
end
local budget, keep = tonumber(ARGV[1]), tonumber(ARGV[2])
local stop, used, kept = tonumber(ARGV[3]), tonumber(ARGV[4]), tonumber(ARGV[5])

local function cost(header, raw)
  local w = string.match(header, ' w=(%d+)')
  if w then
    return tonumber(w)
  end
  return math.ceil(string.len(raw) / 4)
end

local corrupt = wrong_type('list', {turns, lead}) or wrong_type('hash', {summary, blobs})
if corrupt then
  return {'CORRUPT', corrupt}
end
local text = false
if ARGV[7] == '1' then
  local s = redis.call('HMGET', summary, 'text', 'watermark')
  if s[1] then
    text = s[1]
    local limit = math.max(0, tonumber(redis.call('HGET', meta, 'turns') or '0') - tonumber(s[2]))
    if limit == 0 then
      return {'DONE', 0, -1, text}
    end
    if keep <= 0 or keep > limit then
      keep = limit
    end
    used = used + 4 + math.ceil(string.len(text) / 4)
  end
end
local length = redis.call('LLEN', turns)
local inline = stop < 0  -- a first call may answer with the elements themselves
local lead_raws = {}
if stop < 0 then
  stop = length - 1
  lead_raws = redis.call('LRANGE', lead, 0, -1)
  for _, raw in ipairs(lead_raws) do
    local kind, header = element_header(raw)
    if not kind then
      return {'CORRUPT', lead}
    end
    used = used + cost(header, raw)
  end
  used = math.min(used, budget)
end
local last = stop
if ARGV[6] ~= '' then
  last = tonumber(ARGV[6])
end
-- The kept elements newest first, their headers beside them (for the inline answer).
local raws_rev, heads_rev, kept_count = {}, {}, 0

-- The answer once the window is chosen: with the lead, the elements and their blobs when
-- a first call read them all (at most INLINE_MAX), else the range for the client to read.
local function done(first)
  if not inline or kept_count > INLINE_MAX then
    return {'DONE', first, last, text}
  end
  local raws, refs, seen = {}, {}, {}
  for _, raw in ipairs(lead_raws) do
    local _, header = element_header(raw)
    add_refs(refs, seen, header)
  end
  for i = kept_count, 1, -1 do
    raws[#raws + 1] = raws_rev[i]
    add_refs(refs, seen, heads_rev[i])
  end
  local pairs_out = {}
  for at = 1, #refs, 500 do
    local chunk = {unpack(refs, at, math.min(at + 499, #refs))}
    local values = redis.call('HMGET', blobs, unpack(chunk))
    for i, sha in ipairs(chunk) do
      if not values[i] then
        return {'CORRUPT', blobs}
      end
      pairs_out[#pairs_out + 1] = sha
      pairs_out[#pairs_out + 1] = values[i]
    end
  end
  return {'DONE', first, last, text, lead_raws, raws, pairs_out}
end

local first, pending, scanned, batch_size = stop + 1, 0, 0, 16
local pending_raws, pending_heads = {}, {}
while stop >= 0 and (keep <= 0 or kept < keep) do
  local start = math.max(0, stop - batch_size + 1)
  -- Negative indexes: Redis walks a long list from its nearer end.
  local batch = redis.call('LRANGE', turns, start - length, stop - length)
  for i = #batch, 1, -1 do
    local index = start + i - 1
    local kind, header = element_header(batch[i])
    if not kind then
      return {'CORRUPT', turns}
    end
    pending = pending + cost(header, batch[i])
    pending_raws[#pending_raws + 1] = batch[i]
    pending_heads[#pending_heads + 1] = header
    scanned = scanned + 1
    if kind == 'T' or index == 0 then
      if used + pending > budget then
        return done(first)
      end
      used, pending, kept, first = used + pending, 0, kept + 1, index
      for j = 1, #pending_raws do
        kept_count = kept_count + 1
        if kept_count <= INLINE_MAX then
          raws_rev[kept_count] = pending_raws[j]
          heads_rev[kept_count] = pending_heads[j]
        end
      end
      pending_raws, pending_heads = {}, {}
      if keep > 0 and kept >= keep then
        return done(first)
      end
      if scanned >= SCAN_MAX and index > 0 then
        return {'MORE', index - 1, used, kept, last, keep, text}
      end
    end
  end
  stop = start - 1
  batch_size = math.min(batch_size * 2, 256)
end
return done(first)
