-- Shared helpers, prepended to every script when it is loaded (no KEYS or ARGV of their own).
-- Redis 6.2 compatible: plain EVAL scripts, no functions, no flags, no 7-only commands.
-- Numbers reach redis.call as strings via istr(): Lua's default number format (%.14g)
-- would mangle large integers.

local TERMINAL = {succeeded = true, failed = true, cancelled = true}
local NO_BLOBS = {blobs = {}, messages = {}}

local function istr(n)
  return string.format('%d', n)
end

-- Redis server time in ms. Scripts calling this start with redis.replicate_commands().
local function now_ms()
  local t = redis.call('TIME')
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A stored format_version we do not know, or nil when it is 1 or not set yet.
local function bad_version(meta)
  local v = redis.call('HGET', meta, 'format_version')
  if v and v ~= '1' then
    return v
  end
  return nil
end

local function emit(events, maxlen, etype, data)
  redis.call('XADD', events, 'MAXLEN', '~', maxlen, '*', 'type', etype, 'data', data)
end

-- Appends n events (ARGV[first], ARGV[first + 1] = type, data; then the next pair) in their
-- order: what the runner buffered since its last write, sent along with that write.
local function emit_batch(events, maxlen, first, n)
  for i = first, first + 2 * n - 1, 2 do
    emit(events, maxlen, ARGV[i], ARGV[i + 1])
  end
end

-- Whether someone asked the running turn to stop (the cancel script sets the flag).
local function cancel_requested(turn)
  return redis.call('HGET', turn, 'cancel') == '1'
end

local function status_data(status)
  return '{"status":"' .. status .. '"}'
end

-- k = {inbox, turn, journal, cont, events}. Ends a turn: final status with its result or
-- error, out of the inbox, scratch state dropped, "done" emitted, record set to expire.
local function finish(k, tid, status, field, value, ttl_ms, maxlen, now)
  redis.call('HSET', k.turn, 'status', status, field, value, 'finished_ms', istr(now))
  redis.call('HDEL', k.turn, 'cancel')
  redis.call('LREM', k.inbox, 1, tid)
  redis.call('DEL', k.journal, k.cont)
  emit(k.events, maxlen, 'status', status_data(status))
  emit(k.events, maxlen, 'done', status_data(status))
  redis.call('PEXPIRE', k.turn, ttl_ms)
  redis.call('PEXPIRE', k.events, ttl_ms)
end

-- The checks shared by commit, fail, checkpoint and park: nil when the caller may go on.
local function guard_run(lease, inbox, turn, tid, fence, allowed)
  local status = redis.call('HGET', turn, 'status')
  if not status then
    return 'UNKNOWN'
  end
  if TERMINAL[status] then
    return 'APPLIED'
  end
  local l = redis.call('HMGET', lease, 'fence', 'state')
  if l[1] ~= fence or l[2] ~= 'active' then
    return 'STALE'
  end
  if redis.call('LINDEX', inbox, 0) ~= tid then
    return 'NOT_HEAD'
  end
  if not allowed[status] then
    return 'NOT_RUNNING'
  end
  return nil
end

-- After a turn ended: keep the lease (same fence) for the next queued turn and return its
-- id, or free the lease and return false.
local function hand_off(lease, inbox, lease_ms, now)
  local nxt = redis.call('LINDEX', inbox, 0)
  if nxt then
    redis.call('HSET', lease, 'expires_ms', istr(now + tonumber(lease_ms)))
    redis.call('PEXPIRE', lease, lease_ms)
    return nxt
  end
  redis.call('DEL', lease)
  return false
end

-- Writes must not fail half way (Lua does not roll back), so a script checks the keys it
-- writes before its first write: the first of `keys` holding another type than `want` (a
-- missing key is fine), or nil.
local function wrong_type(want, keys)
  for _, key in ipairs(keys) do
    local t = redis.call('TYPE', key)['ok']
    if t ~= 'none' and t ~= want then
      return key
    end
  end
  return nil
end

-- meta when one of the counters named is set but not an integer (HINCRBY would fail).
local function bad_counters(meta, ...)
  local values = redis.call('HMGET', meta, ...)
  for i = 1, select('#', ...) do
    if values[i] and not string.match(values[i], '^%-?%d+$') then
      return meta
    end
  end
  return nil
end

-- The keys of a script that ends a turn, from KEYS[first] on: k = {inbox, lease, turn,
-- journal, cont, events} (what finish() and hand_off() write); and {'CORRUPT', key} when
-- one of them holds the wrong type, else nil.
local function turn_ending(first)
  local k = {inbox = KEYS[first], lease = KEYS[first + 1], turn = KEYS[first + 2],
    journal = KEYS[first + 3], cont = KEYS[first + 4], events = KEYS[first + 5]}
  local bad = wrong_type('list', {k.inbox}) or wrong_type('hash', {k.lease, k.turn})
    or wrong_type('stream', {k.events})
  return k, bad and {'CORRUPT', bad} or nil
end

-- Decoded element, or nil when it does not parse.
local function decode_element(raw)
  local ok, value = pcall(cjson.decode, raw)
  if not ok or type(value) ~= 'table' or type(value.messages) ~= 'table' then
    return nil
  end
  if value.blobs ~= nil and type(value.blobs) ~= 'table' then
    return nil
  end
  return value
end

-- A turn starts at a user message; an element led by any other role continues the turn
-- before it (except the very first element, which always opens a turn).
local function starts_turn(decoded, index)
  local first = decoded.messages[1]
  return index == 0 or (type(first) == 'table' and first.role == 'user')
end

-- Elements of the last `window` turns (0 = all), oldest first, walking back in batches so
-- only the window is read. Returns raws, decoded; or nil on a malformed element.
local function window_elements(turns, window)
  if window <= 0 then
    local raws = redis.call('LRANGE', turns, 0, -1)
    local decoded = {}
    for i, raw in ipairs(raws) do
      -- Elements without attachments need no decoding here; the client parses them all.
      if string.sub(raw, 1, 12) == '{"blobs":[],' then
        decoded[i] = NO_BLOBS
      else
        decoded[i] = decode_element(raw)
        if not decoded[i] then
          return nil
        end
      end
    end
    return raws, decoded
  end
  local raws_rev, dec_rev, starts = {}, {}, 0
  local stop = redis.call('LLEN', turns) - 1
  while stop >= 0 and starts < window do
    local start = math.max(0, stop - (window - starts) + 1)
    local batch = redis.call('LRANGE', turns, start, stop)
    for i = #batch, 1, -1 do
      local d = decode_element(batch[i])
      if not d then
        return nil
      end
      raws_rev[#raws_rev + 1] = batch[i]
      dec_rev[#dec_rev + 1] = d
      if starts_turn(d, start + i - 1) then
        starts = starts + 1
        if starts == window then
          break
        end
      end
    end
    stop = start - 1
  end
  local raws, decoded = {}, {}
  for i = #raws_rev, 1, -1 do
    raws[#raws + 1] = raws_rev[i]
    decoded[#decoded + 1] = dec_rev[i]
  end
  return raws, decoded
end

-- Appends the blob refs of a decoded element to refs, each sha once (seen: sha -> true).
local function add_refs(refs, seen, decoded)
  for _, sha in ipairs(decoded.blobs or {}) do
    if not seen[sha] then
      seen[sha] = true
      refs[#refs + 1] = sha
    end
  end
end

-- {lead elements, window elements, {sha, bytes, ...}} or nil, name of the malformed key.
local function load_window(lead, turns, blobs, window)
  local lead_raw = redis.call('LRANGE', lead, 0, -1)
  local refs, seen = {}, {}
  for _, raw in ipairs(lead_raw) do
    local d = decode_element(raw)
    if not d then
      return nil, lead
    end
    add_refs(refs, seen, d)
  end
  local raws, decoded = window_elements(turns, window)
  if not raws then
    return nil, turns
  end
  for _, d in ipairs(decoded) do
    add_refs(refs, seen, d)
  end
  local pairs_out = {}
  -- HMGET in chunks: unpack() of a very long table would overflow the Lua stack.
  for first = 1, #refs, 500 do
    local chunk = {unpack(refs, first, math.min(first + 499, #refs))}
    local values = redis.call('HMGET', blobs, unpack(chunk))
    for i, sha in ipairs(chunk) do
      if not values[i] then
        return nil, blobs
      end
      pairs_out[#pairs_out + 1] = sha
      pairs_out[#pairs_out + 1] = values[i]
    end
  end
  return {lead_raw, raws, pairs_out}
end

-- Store sha/bytes pairs from ARGV[first..]; returns the bytes newly added.
local function store_blobs(blobs, first)
  local added = 0
  for i = first, #ARGV, 2 do
    if redis.call('HSETNX', blobs, ARGV[i], ARGV[i + 1]) == 1 then
      added = added + string.len(ARGV[i + 1])
    end
  end
  return added
end

