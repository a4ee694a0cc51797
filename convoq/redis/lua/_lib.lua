-- Shared helpers, prepended to every script when it is loaded (no KEYS or ARGV of their own).
-- Redis 6.2 compatible: plain EVAL scripts, no functions, no flags, no 7-only commands.
-- Numbers reach redis.call as strings via istr(): Lua's default number format (%.14g)
-- would mangle large integers.

-- interrupted: stopped by a newer message, its finished steps stored; merged: a message
-- answered by the turn it joined (double texting, submit.lua).
local TERMINAL = {succeeded = true, failed = true, cancelled = true, expired = true,
  blocked = true, interrupted = true, merged = true}
-- Parked: waiting for decisions on tool calls, a person's (awaiting_approval) or, when
-- every call waits for a child turn (a sub-agent call), the children's (waiting).
local PARKED = {awaiting_approval = true, waiting = true}
-- The stored layout this code reads and writes (FORMAT_VERSION in _codec.py).
local FORMAT = '2'

local function istr(n)
  return string.format('%d', n)
end

-- The server time of the last now_ms() in this call, in microseconds (digits), or nil.
local clock_us = nil

-- Redis server time in ms. Scripts calling this start with redis.replicate_commands().
local function now_ms()
  local t = redis.call('TIME')
  clock_us = t[1] .. string.format('%06d', tonumber(t[2]))
  return tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
end

-- A stored format_version we do not know, or nil when it is FORMAT or not set yet.
local function bad_version(meta)
  local v = redis.call('HGET', meta, 'format_version')
  if v and v ~= FORMAT then
    return v
  end
  return nil
end

local function emit(events, maxlen, etype, data)
  redis.call('XADD', events, 'MAXLEN', '~', maxlen, '*', 'type', etype, 'data', data)
end

-- A command that is a script's first touch of `key` before any write: its reply, or nil
-- when `key` holds another type (the caller answers {'CORRUPT', key}; nothing written).
-- Cheaper than a TYPE check first: the read (or the first write) is sent anyway.
local function touch(key, ...)
  local r = redis.pcall(...)
  if type(r) == 'table' and r.err then
    if string.find(r.err, 'WRONGTYPE', 1, true) then
      return nil
    end
    error(r)
  end
  return r
end

-- emit() as a script's first write: false (nothing written) when `events` is no stream.
local function emit_first(events, maxlen, etype, data)
  return touch(events, 'XADD', events, 'MAXLEN', '~', maxlen, '*', 'type', etype, 'data',
    data) ~= nil
end

-- A stream id 'ms-seq' as two numbers, or nil.
local function stream_id(id)
  local ms, seq = string.match(id or '', '^(%d+)%-(%d+)$')
  if not ms then
    return nil
  end
  return tonumber(ms), tonumber(seq)
end

-- Appends `list` ({type, data} pairs, in order) to `events` as ONE stream entry and returns
-- its id; nil (nothing written) when `events` holds another type. `turn`: the JSON of the
-- turn's live fields as this call leaves them (what a waiter needs), carried along.
-- One event is an entry of its own ('type', 'data'; id from the server clock). Several go
-- as a JSON array ('events') in an entry whose id reserves an id per event: with n events
-- it is ms-(s+n-1), the events are ms-s .. ms-(s+n-1) (_events.py reads them so), all of
-- them above the stream's last id, so every event id is a strictly increasing stream id
-- a reader can resume from. ms is the millisecond after the server clock `now` (no id the
-- server gave out from its clock is there yet, so s = 0), unless the stream is ahead of
-- the clock: the last id the record remembers (`last`) says so, or the XADD is refused;
-- then the stream's real last id is read and the range follows it. (Nothing is written
-- after such an entry: it ends the turn.)
local function emit_events(events, maxlen, list, now, last, turn)
  local n = #list
  local fields
  if n == 1 then
    fields = {'type', list[1][1], 'data', list[1][2]}
  else
    local items = {}
    for i = 1, n do
      items[i] = '{"type":' .. cjson.encode(list[i][1]) .. ',"data":' .. list[i][2] .. '}'
    end
    fields = {'events', '[' .. table.concat(items, ',') .. ']'}
  end
  if turn then
    fields[#fields + 1] = 'turn'
    fields[#fields + 1] = turn
  end
  if n == 1 then
    return touch(events, 'XADD', events, 'MAXLEN', '~', maxlen, '*', unpack(fields))
  end
  local function add(after)
    local ms, seq = stream_id(after)
    local id_ms, first = now + 1, 0
    if ms and ms > now then
      id_ms, first = ms, seq + 1
    end
    return touch(events, 'XADD', events, 'MAXLEN', '~', maxlen,
      istr(id_ms) .. '-' .. istr(first + n - 1), unpack(fields))
  end
  local function top()
    local entries = touch(events, 'XREVRANGE', events, '+', '-', 'COUNT', 1)
    return entries and (entries[1] and entries[1][1] or false)
  end
  local ms = stream_id(last)
  if ms and ms > now then
    last = top()
    if last == nil then
      return nil
    end
  end
  local ok, id = pcall(add, last)
  if ok then
    return id
  end
  if not string.find(tostring(id.err or id), 'equal or smaller', 1, true) then
    error(id)
  end
  return add(top())
end

-- Meta hashes this call saw stamped with FORMAT, and the fence each held when it was read
-- (false: none yet); new_fence() keeps the latter current (these tables are new in every
-- call).
local stamped = {}
local fences = {}
-- Meta's 'summarised' ('1' once summarise.lua stored a summary; never cleared, so at worst
-- a turn reads its window once more to find none): a turn handed out says so, and its
-- runner then reads the window with the summary whatever its profile's compaction.
local summarised = {}

-- {'CORRUPT', meta} or {'VERSION', v} when the conversation cannot be served, else nil and
-- the values of the meta fields named in `...` (read in the same command). The fence is
-- read along (new_fence() needs no read of its own); a second call without fields sends
-- nothing: the format cannot have changed in between.
local function meta_refusal(meta, ...)
  local extra = select('#', ...)
  if extra == 0 and fences[meta] ~= nil then
    return nil, {}
  end
  local v = touch(meta, 'HMGET', meta, 'format_version', 'fence', 'summarised', ...)
  if v == nil then
    return {'CORRUPT', meta}
  end
  if v[1] and v[1] ~= FORMAT then
    return {'VERSION', v[1]}
  end
  stamped[meta] = v[1] == FORMAT
  fences[meta] = v[2]
  summarised[meta] = v[3] == '1'
  return nil, {unpack(v, 4, 3 + extra)}
end

-- Stamps meta with FORMAT unless this call read it stamped already (a command less).
local function stamp(meta)
  if not stamped[meta] then
    redis.call('HSETNX', meta, 'format_version', FORMAT)
    stamped[meta] = true
  end
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

-- Whether the running turn is to stop before its next step: cancelled, or interrupted by a
-- newer message (double texting, stop_head()), which the renewal does not report: an
-- interrupted turn finishes the step it is in.
local function stop_requested(turn)
  local flags = redis.call('HMGET', turn, 'cancel', 'stop')
  return flags[1] == '1' or flags[2] == 'interrupt'
end

local function status_data(status)
  return '{"status":"' .. status .. '"}'
end

-- k = {inbox, turn, journal, cont, events[, last]}. Ends a turn: the n events buffered in
-- ARGV[first ..] (type, data pairs; n may be 0), final status with its result or error,
-- out of the inbox, scratch state dropped, "done" emitted, record set to expire. The
-- events go as one stream entry (emit_events(); k.last: the record's last event id, when
-- read), and they are its first write, so an events key of another type refuses it
-- (false, nothing written) without a TYPE check; else true. k.turn and k.inbox were read
-- already. `run` ({attempts, started_ms} as the record holds them): the entry carries the
-- record's live fields as they are now, so a waiter needs no read of the record.
local function finish(k, tid, status, field, value, ttl_ms, maxlen, now, first, n, run)
  local pending = {}
  for i = first or 1, (first or 1) + 2 * (n or 0) - 1, 2 do
    pending[#pending + 1] = {ARGV[i], ARGV[i + 1]}
  end
  pending[#pending + 1] = {'status', status_data(status)}
  pending[#pending + 1] = {'done', status_data(status)}
  local live = nil
  if run then
    local function number(v)
      return (v and string.match(v, '^%d+$')) and v or 'null'
    end
    live = '{"status":"' .. status .. '","' .. field .. '":' .. value .. ',"attempts":'
      .. number(run.attempts) .. ',"started_ms":' .. number(run.started_ms)
      .. ',"finished_ms":' .. istr(now) .. '}'
  end
  if not emit_events(k.events, maxlen, pending, now, k.last, live) then
    return false
  end
  redis.call('HSET', k.turn, 'status', status, field, value, 'finished_ms', istr(now))
  if k.cancel ~= false then  -- false: the caller read the record and saw no cancel flag
    redis.call('HDEL', k.turn, 'cancel')
  end
  redis.call('LREM', k.inbox, 1, tid)
  if k.saved == false then  -- guard_run() saw no journal nor continuation can exist
    -- nothing to keep or delete
  elseif status == 'failed' then
    -- A failed turn may be retried as the same turn (retry.lua): its journal and its
    -- continuation live as long as its record, so a retry replays the finished steps.
    redis.call('PEXPIRE', k.journal, ttl_ms)
    redis.call('PEXPIRE', k.cont, ttl_ms)
  else
    redis.call('DEL', k.journal, k.cont)
  end
  redis.call('PEXPIRE', k.turn, ttl_ms)
  redis.call('PEXPIRE', k.events, ttl_ms)
  return true
end

-- The checks shared by commit, fail, checkpoint and park: nil, whether a cancel was
-- requested and what the reads saw (`ahead`: the lease's fence and holder, and the `span`
-- inbox entries behind the head, default none: next and peek) when the caller may go on,
-- else a refusal code ('CORRUPT' with the key that holds another type).
local function guard_run(lease, inbox, turn, tid, fence, allowed, span)
  local rec = touch(turn, 'HMGET', turn, 'status', 'cancel', 'last_event', 'attempts',
    'started_ms', 'journaled', 'parked_ms')
  if rec == nil then
    return 'CORRUPT', turn
  end
  local status = rec[1]
  if not status then
    return 'UNKNOWN'
  end
  if TERMINAL[status] then
    return 'APPLIED'
  end
  local l = touch(lease, 'HMGET', lease, 'fence', 'state', 'holder')
  if l == nil then
    return 'CORRUPT', lease
  end
  if l[1] ~= fence or l[2] ~= 'active' then
    return 'STALE'
  end
  local queue = touch(inbox, 'LRANGE', inbox, 0, span or 0)
  if queue == nil then
    return 'CORRUPT', inbox
  end
  if queue[1] ~= tid then
    return 'NOT_HEAD'
  end
  if not allowed[status] then
    return 'NOT_RUNNING'
  end
  -- `saved`: the turn may have a journal (a checkpoint marked it) or a continuation (it
  -- parked once): false, and ending it has neither to delete (a command less).
  return nil, rec[2] == '1',
    {fence = l[1], holder = l[3] or '', next = queue[2] or false, peek = queue[3] or false,
      last = rec[3] or nil, run = {attempts = rec[4], started_ms = rec[5]},
      saved = rec[6] ~= false or rec[7] ~= false}
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

-- `hash` when one of the counters named is set but not an integer (HINCRBY would fail).
local function bad_counters(hash, ...)
  local values = redis.call('HMGET', hash, ...)
  for i = 1, select('#', ...) do
    if values[i] and not string.match(values[i], '^%-?%d+$') then
      return hash
    end
  end
  return nil
end

-- The keys of one turn: k = {inbox, lease, turn, journal, cont, events}, the last four
-- from KEYS[first .. first + 3].
local function turn_keys(inbox, lease, first)
  return {inbox = inbox, lease = lease, turn = KEYS[first], journal = KEYS[first + 1],
    cont = KEYS[first + 2], events = KEYS[first + 3]}
end

-- The keys of a script that ends a turn, from KEYS[first] on: k = {inbox, lease, turn,
-- journal, cont, events} (what finish() and hand_over() write); and {'CORRUPT', key} when
-- one of them holds the wrong type, else nil.
local function turn_ending(first)
  local k = turn_keys(KEYS[first], KEYS[first + 1], first + 2)
  local bad = wrong_type('list', {k.inbox}) or wrong_type('hash', {k.lease, k.turn})
    or wrong_type('stream', {k.events})
  return k, bad and {'CORRUPT', bad} or nil
end

-- Double texting (submit.lua): a submit with if_busy 'interrupt' or 'rollback' acts on the
-- inbox head; one with 'merge' may join the inbox tail. The client read which turn that was
-- (`seen`, '' when the inbox was empty) and sent its keys: k = turn_keys() of it, or nil.

-- A refusal when the inbox's turn at `at` (0: head, -1: tail) is no longer `seen`
-- ({'MOVED'}: the client reads it again and resends) or a key holds another type
-- ({'CORRUPT', key}); else nil. Nothing is written.
local function busy_moved(inbox, at, seen, k)
  local now = touch(inbox, 'LINDEX', inbox, at)
  if now == nil then
    return {'CORRUPT', inbox}
  end
  if (now or '') ~= seen then
    return {'MOVED'}
  end
  local bad = k and (wrong_type('hash', {k.turn}) or wrong_type('stream', {k.events}))
  return bad and {'CORRUPT', bad} or nil
end

-- What 'interrupt' or 'rollback' (`mode`) sent by turn `by` does to the head `head` (keys
-- k): a parked head ends cancelled at once (its pending calls are never decided) and frees
-- the conversation; a rollback ends a head not running (queued, or its lease lapsed) the
-- same way; else the head is flagged: interrupt, it stops at its next step boundary and
-- keeps its finished steps; rollback, the cancel flag (it stops, storing nothing). A head
-- stopped once is not stopped again. `err`: the error JSON of a head ended here.
-- Returns 'cancelled' (ended here), 'stopping' (flagged) or '' (nothing done).
local function stop_head(k, lease, head, mode, by, err, ttl, maxlen)
  if not k then
    return ''
  end
  local rec = redis.call('HMGET', k.turn, 'status', 'stopped_by')
  local status = rec[1]
  if not status or TERMINAL[status] or rec[2] then
    return ''
  end
  redis.call('HSET', k.turn, 'stopped_by', by, 'stop', mode)
  local running = status == 'running' and redis.call('HGET', lease, 'state') == 'active'
  if PARKED[status] or (mode == 'rollback' and not running) then
    finish(k, head, 'cancelled', 'error', err, ttl, maxlen, now_ms())
    if PARKED[status] then
      redis.call('DEL', lease)
    end
    return 'cancelled'
  end
  if mode == 'rollback' then
    redis.call('HSET', k.turn, 'cancel', '1')
  end
  emit(k.events, maxlen, 'stop_requested', '{"mode":"' .. mode .. '","by":"' .. by .. '"}')
  return 'stopping'
end

-- Whether a 'merge' submit of `input` under merge key `key` joins the tail (keys k): one
-- submitted with 'merge' under the same key (same agent and options) that never ran (no
-- attempt: a retried turn keeps counting them, and has a journal of its old message) and
-- is not being stopped, whose inputs with this one stay within `max` bytes.
local function mergeable(k, key, input, max)
  if not k then
    return false
  end
  local rec = redis.call('HMGET', k.turn, 'status', 'attempts', 'merge_key', 'stopped_by',
    'input', 'merged')
  return rec[1] == 'queued' and (rec[2] or '0') == '0' and rec[3] == key and not rec[4]
    and string.len(rec[5] or '') + string.len(rec[6] or '') + string.len(input) <= max
end

-- Turn `tid` (record `turn`, stream `events`, new) joins the tail `into` (keys k): its own
-- record ends "merged" naming `into`, which keeps its input in 'merged' (a JSON array of
-- {turn_id, input}, in order: the record's reader appends them to its user message).
-- Returns false (nothing written) when `events` holds another type, else true.
local function merge_into(k, into, turn, events, tid, agent, input, options, ttl, maxlen)
  local data = '{"status":"merged","merged_into":"' .. into .. '"}'
  local first = touch(events, 'XADD', events, 'MAXLEN', '~', maxlen, '*', 'type', 'status',
    'data', data)
  if first == nil then
    return false
  end
  emit(events, maxlen, 'done', data)
  local now = istr(stream_id(first))
  redis.call('HSET', turn, 'status', 'merged', 'agent', agent, 'input', input, 'options',
    options, 'attempts', '0', 'runs', '0', 'created_ms', now, 'finished_ms', now,
    'merged_into', into, 'last_event', first)
  redis.call('PEXPIRE', turn, ttl)
  redis.call('PEXPIRE', events, ttl)
  local item = '{"turn_id":"' .. tid .. '","input":' .. input .. '}'
  local merged = redis.call('HGET', k.turn, 'merged')
  merged = merged and (string.sub(merged, 1, -2) .. ',' .. item .. ']') or ('[' .. item .. ']')
  redis.call('HSET', k.turn, 'merged', merged)
  emit(k.events, maxlen, 'merged', '{"turn_id":"' .. tid .. '"}')
  return true
end

-- Most elements one script call reads: a longer window (or a whole long history) is left
-- to the client, which reads it in chunks, so no call blocks Redis longer than this.
local INLINE_MAX = 256

-- The header line of a stored element (format 2, see _codec.py): 'T' (starts a turn) or
-- 'C' (continues the element before it), then ' name=value' fields; nil when malformed.
-- Only the header is looked at: no JSON decoding.
local function element_header(raw)
  local kind = string.sub(raw, 1, 1)
  if kind ~= 'T' and kind ~= 'C' then
    return nil
  end
  if string.byte(raw, 2) == 10 then
    return kind, ''
  end
  local newline = string.find(raw, '\n', 2, true)
  if not newline then
    return nil
  end
  return kind, string.sub(raw, 2, newline - 1)
end

-- Elements of the last `window` turns (0 = all), oldest first, walking back from the end
-- in batches (negative indexes: no LLEN) so only the window is read. Returns raws,
-- headers; nil on a malformed element; false when more than INLINE_MAX elements would be
-- read (the client reads them in chunks).
local function window_elements(turns, window)
  if window <= 0 then
    -- One element past the limit says the whole history is too long to read here.
    local all = touch(turns, 'LRANGE', turns, 0, INLINE_MAX)
    if all == nil then
      return nil
    end
    if #all > INLINE_MAX then
      return false
    end
    local headers = {}
    for i, raw in ipairs(all) do
      local kind, header = element_header(raw)
      if not kind then
        return nil
      end
      headers[i] = header
    end
    return all, headers
  end
  local raws_rev, heads_rev, starts, read = {}, {}, 0, 0
  while starts < window do
    if #raws_rev >= INLINE_MAX then
      return false
    end
    local want = math.min(window - starts, INLINE_MAX - #raws_rev)
    local batch = touch(turns, 'LRANGE', turns, -read - want, -read - 1)
    if batch == nil then
      return nil
    end
    -- A short batch reached the first element, which starts a turn whatever its kind.
    local at_start = #batch < want
    for i = #batch, 1, -1 do
      local kind, header = element_header(batch[i])
      if not kind then
        return nil
      end
      raws_rev[#raws_rev + 1] = batch[i]
      heads_rev[#heads_rev + 1] = header
      if kind == 'T' or (at_start and i == 1) then
        starts = starts + 1
        if starts == window then
          break
        end
      end
    end
    read = read + #batch
    if at_start then
      break
    end
  end
  local raws, headers = {}, {}
  for i = #raws_rev, 1, -1 do
    raws[#raws + 1] = raws_rev[i]
    headers[#headers + 1] = heads_rev[i]
  end
  return raws, headers
end

-- Appends the blob refs of an element header (its ' b=sha,sha' field) to refs, each sha
-- once (seen: sha -> true).
local function add_refs(refs, seen, header)
  if header == '' then
    return
  end
  local list = string.match(header, ' b=([0-9a-f,]+)')
  if not list then
    return
  end
  for sha in string.gmatch(list, '[0-9a-f]+') do
    if not seen[sha] then
      seen[sha] = true
      refs[#refs + 1] = sha
    end
  end
end

-- {lead elements, window elements or false (too long: the client reads it), {sha, bytes,
-- ...}} or nil, name of the malformed key. `no_lead`: meta says the lead list is empty
-- (its 'lead' field is '0': see append.lua), so it is not read.
local function load_window(lead, turns, blobs, window, no_lead)
  local lead_raw = {}
  if not no_lead then
    lead_raw = touch(lead, 'LRANGE', lead, 0, -1)
  end
  if lead_raw == nil then
    return nil, lead
  end
  local refs, seen = {}, {}
  for _, raw in ipairs(lead_raw) do
    local kind, header = element_header(raw)
    if not kind then
      return nil, lead
    end
    add_refs(refs, seen, header)
  end
  local raws, headers = window_elements(turns, window)
  if raws == nil then
    return nil, turns
  end
  if raws == false then
    return {lead_raw, false, {}}
  end
  for _, header in ipairs(headers) do
    add_refs(refs, seen, header)
  end
  local pairs_out = {}
  -- HMGET in chunks: unpack() of a very long table would overflow the Lua stack.
  for first = 1, #refs, 500 do
    local chunk = {unpack(refs, first, math.min(first + 499, #refs))}
    local values = touch(blobs, 'HMGET', blobs, unpack(chunk))
    if values == nil then
      return nil, blobs
    end
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


-- Handing out a turn: what acquire does for the inbox head, and commit and fail for the
-- turn queued behind the one they end (so a busy conversation costs one round trip per
-- turn). h = {meta, turns, blobs, lead}; k = turn_keys() of the turn handed out.

-- The options of handing out a turn, from ARGV[first .. first + 7]: turn ttl ms (records
-- of turns failed on the way), events MAXLEN, lease ms, history window in turns (0 = all),
-- max attempts (runs that crashed), error JSON for a turn over max attempts, max cut-offs
-- (runs cut off from Redis), error JSON for a turn over max cut-offs.
local function take_options(first)
  return {ttl = ARGV[first], maxlen = ARGV[first + 1], lease_ms = ARGV[first + 2],
    windows = ARGV[first + 3], max_attempts = tonumber(ARGV[first + 4]),
    over_attempts = ARGV[first + 5], max_cut_offs = tonumber(ARGV[first + 6]),
    over_cut_offs = ARGV[first + 7]}
end

-- The error a take stores for a turn over a limit: `worded` (the error JSON the caller
-- worded for that limit) with the counts of the turn's runs in its details: crashed_runs
-- (runs whose worker never reported back), cut_off_runs (runs whose worker reported it
-- was cut off), attempts (runs that started).
local function over_limit(worded, crashed, cut, attempts)
  local err = cjson.decode(worded)
  if type(err.details) ~= 'table' then
    err.details = {}
  end
  err.details.crashed_runs = crashed
  err.details.cut_off_runs = cut
  err.details.attempts = attempts
  return cjson.encode(err)
end

-- Whether an option's value is a whole number >= 0 (what a window option may be).
local function whole(value)
  return type(value) == 'number' and value >= 0 and value == math.floor(value)
    and value < math.huge
end

-- The history window (turns, 0 = all) a turn is handed out with: WindowRule's precedence
-- (convoq/window.py, where it is written; tests/test_window_precedence.py holds this copy
-- to it case by case). o.windows is the JSON [default, {agent name: turns}] the worker
-- decided once per agent profile (WindowRule.handed); -1: that agent's window is chosen by
-- the store (a token budget or a compaction policy, read apart), so one turn comes along,
-- as it does when the conversation has a stored summary (`summarised`) or the turn its own
-- max_history_tokens. Else a turn's own keep_last_turns wins over its agent's window. An
-- option counts when it is a whole number >= 0; options are decoded only when they name
-- one of those (most turns carry neither).
local function turn_window(rec, o, summarised)
  if type(o.windows) == 'string' then
    o.windows = cjson.decode(o.windows)  -- once per call: commit may hand out a turn too
  end
  local window = o.windows[2][rec.agent or ''] or o.windows[1]
  if window < 0 or summarised then
    return 1
  end
  local options = rec.options
  if options and (string.find(options, '"keep_last_turns"', 1, true)
      or string.find(options, '"max_history_tokens"', 1, true)) then
    local ok, asked = pcall(cjson.decode, options)
    if ok and type(asked) == 'table' then
      if whole(asked.max_history_tokens) then
        return 1
      end
      if whole(asked.keep_last_turns) then
        return asked.keep_last_turns
      end
    end
  end
  return window
end

-- Whether a counter field's value (false: not set) would take HINCRBY.
local function counter_ok(value)
  return not value or string.match(value, '^%-?%d+$') ~= nil
end

-- The state a turn resumes from: 'journal'|'cont'|false, its JSON or false (a journal is
-- newer than a continuation: park deletes the journal); nil, key of another type.
local function saved_state(k)
  local state = touch(k.journal, 'GET', k.journal)
  if state == nil then
    return nil, k.journal
  end
  if state then
    return 'journal', state
  end
  state = touch(k.cont, 'GET', k.cont)
  if state == nil then
    return nil, k.cont
  end
  if state then
    return 'cont', state
  end
  return false, false
end

-- A new fence token for the conversation (its current one read by meta_refusal() when
-- that ran in this call).
local function new_fence(meta)
  local current = fences[meta]
  if current == nil then
    current = redis.call('HGET', meta, 'fence')
  end
  local fence
  if current then
    fence = istr(redis.call('HINCRBY', meta, 'fence', 1))
  else
    -- Seeded with the server time in microseconds (16 digits: exact as a Lua number) so
    -- fences keep increasing even after the conversation was cleared (and its meta with
    -- the counter deleted). acquire has it from the "running" event's id, whole
    -- milliseconds (x 1000): a fence after a clear then needs a millisecond more to pass.
    if not clock_us then
      now_ms()
    end
    fence = istr(tonumber(clock_us) + 1)
    if stamped[meta] then
      redis.call('HSET', meta, 'fence', fence)
    else  -- a new conversation: its stamp goes along (submit leaves it to this write)
      redis.call('HSET', meta, 'fence', fence, 'format_version', FORMAT)
      stamped[meta] = true
    end
  end
  fences[meta] = fence
  return fence
end

-- The "resumed" event's data when a run goes on with a turn another run started: why
-- (a run taking over the lease of one that lapsed, worker_lost, of one whose worker
-- reported it was cut off from Redis, worker_cut_off, or that its worker handed back on
-- shutdown, worker_stopped; a failed turn retried, retried; a parked turn whose approvals
-- were all decided, approval_decided, or whose approval expired, approval_expired; a turn
-- waiting for child turns whose children all ended, children_done, or for results or
-- signals that all arrived, wait_done, or whose wait expired, wait_expired) and the
-- attempt it is.
local function resumed_data(rec, attempts)
  local why
  if rec.status == 'running' then
    if rec.handed_back == '1' then
      why = 'worker_stopped'
    elseif rec.handed_back == 'handoff' then
      why = 'handed_off'  -- transfer.lua: queued again for the pool of its new agent
    else
      why = rec.cut_off == '1' and 'worker_cut_off' or 'worker_lost'
    end
  elseif rec.status == 'queued' then
    why = 'retried'
  elseif rec.status == 'waiting' and rec.waits
      and (string.find(rec.waits, '"on":"result"', 1, true)
        or string.find(rec.waits, '"on":"signal"', 1, true)) then
    why = rec.resume == '1' and 'wait_done' or 'wait_expired'
  elseif rec.status == 'waiting' then
    why = rec.resume == '1' and 'children_done' or 'wait_expired'
  else
    why = rec.resume == '1' and 'approval_decided' or 'approval_expired'
  end
  return '{"reason":"' .. why .. '","attempt":' .. istr(attempts) .. '}'
end

-- The writes of handing out a turn (record `rec`, a field -> value table, now on its
-- `runs`-th run) under the lease held by `holder` with `fence`; `rec` is updated to what
-- the record holds then. A run taking over a started turn counts an attempt; a parked
-- turn resumed goes on with the attempt that parked it. Returns the fence and the time of
-- the call in ms (`now`, or when nil the first event's id: the server clock without a
-- TIME call, else TIME); false (nothing written) when its events key holds another type
-- (the events are the first write: "running" for a turn not running yet, then "resumed"
-- for one another run started). A running turn handed out under the lease the caller
-- keeps (`fence`) is the caller's own hand-off taken again (a resent acquire): the same
-- run, no event, no attempt.
local function start_run(h, k, rec, runs, holder, fence, o, now)
  local status = rec.status
  local parked = PARKED[status] == true
  local again = status == 'running' and fence
  local retried = status == 'queued' and (rec.retries or '0') ~= '0'
  local attempts = tonumber(rec.attempts or '0') + ((parked or again) and 0 or 1)
  local events = {}
  if status ~= 'running' then
    events[1] = {'status', status_data('running')}
  end
  if (status == 'running' and not again) or parked or retried then
    events[#events + 1] = {'resumed', resumed_data(rec, attempts)}
  end
  if #events > 1 and not now then
    now = now_ms()  -- one entry of several events takes its id from the clock
  end
  local fields = {}
  if #events > 0 then
    local id = emit_events(k.events, o.maxlen, events, now, rec.last_event)
    if not id then
      return false
    end
    -- Commit's events go after it (emit_events() reads the hint from the record).
    rec.last_event = id
    fields = {'last_event', id}
    if not now then
      now = stream_id(id)
      clock_us = clock_us or istr(now * 1000)  -- a new fence's seed (new_fence())
    end
  end
  now = now or now_ms()
  if rec.handed_back or rec.cut_off then
    redis.call('HDEL', k.turn, 'handed_back', 'cut_off')  -- said by this "resumed" event
    rec.handed_back, rec.cut_off = nil, nil
  end
  fence = fence or new_fence(h.meta)
  redis.call('HSET', k.lease, 'holder', holder, 'fence', fence, 'state', 'active',
    'expires_ms', istr(now + tonumber(o.lease_ms)))
  redis.call('PEXPIRE', k.lease, o.lease_ms)
  stamp(h.meta)
  rec.attempts = istr(attempts)
  rec.runs, rec.status = istr(runs), 'running'
  for _, v in ipairs({'attempts', rec.attempts, 'runs', rec.runs, 'status', 'running'}) do
    fields[#fields + 1] = v
  end
  if not rec.started_ms then
    rec.started_ms = istr(now)
    fields[#fields + 1] = 'started_ms'
    fields[#fields + 1] = rec.started_ms
  end
  redis.call('HSET', k.turn, unpack(fields))
  if parked then
    redis.call('HDEL', k.turn, 'result')  -- the pending approvals are decided now
    rec.result = nil
  end
  return fence, now
end

-- Hands out the inbox head tid with its history window, its saved state and the id of
-- the turn queued behind it (`peek`, read by the caller: false when none). `fence`: the
-- lease the caller holds (kept), or false to take a new one. A head that cannot run is not
-- handed out: dropped when its record is gone or finished, failed when over max attempts.
-- A head parked undecided whose approval expired runs on, stamped with expired_ms.
-- Returns {'OK', fence, turn record as field/value list, state kind, state, lead
-- elements, window elements, {sha, bytes, ...}, id of the next queued turn or false,
-- the window in turns (turn_window())}. `now`: the caller's clock (ms), or nil: taken
-- from the "running" event's id (or TIME when none is added).
--      or {'DROPPED', id of the turn failed here or false} (the head moved on)
--      or {'CORRUPT', key} (nothing written).
-- Every key is checked by its first read (touch()), or its first write (the events),
-- before anything is written; k.inbox and k.lease (and h.meta) by the caller.
local function take_head(h, k, tid, holder, fence, o, now, peek)
  -- The whole record, read once: what is checked here, and what is handed out.
  local all = touch(k.turn, 'HGETALL', k.turn)
  if all == nil then
    return {'CORRUPT', k.turn}
  end
  local rec = {}
  for i = 1, #all, 2 do
    rec[all[i]] = all[i + 1]
  end
  if not (counter_ok(rec.runs or false) and counter_ok(rec.attempts or false)
      and counter_ok(rec.cut_offs or false)) then
    return {'CORRUPT', k.turn}
  end
  local status = rec.status
  if not status or TERMINAL[status] then
    -- An inbox entry without a live record cannot run; drop it.
    redis.call('LREM', k.inbox, 1, tid)
    return {'DROPPED', false}
  end
  -- Parked, undecided and the parked lease is gone: the approval expired.
  local expiring = PARKED[status] and rec.resume ~= '1'
  -- Max attempts counts the runs that crashed: those that started, less those handed
  -- back on shutdown and those whose worker reported them cut off (cut_off.lua), which
  -- max cut-offs bounds apart. A parked turn resumed goes on with the run that parked it,
  -- and cannot be over (nor can the caller's own hand-off taken again: see start_run()).
  local same = PARKED[status] or (status == 'running' and fence)
  local runs = tonumber(rec.runs or '0') + (same and 0 or 1)
  local cut = tonumber(rec.cut_offs or '0')
  local over = nil
  if runs > o.max_attempts then
    over = o.over_attempts
  elseif cut >= o.max_cut_offs and not same then
    over = o.over_cut_offs
  end
  if over then
    k.last = rec.last_event
    over = over_limit(over, tonumber(rec.runs or '0'), cut, tonumber(rec.attempts or '0'))
    if not finish(k, tid, 'failed', 'error', over, o.ttl, o.maxlen, now or now_ms()) then
      return {'CORRUPT', k.events}
    end
    return {'DROPPED', tid}
  end
  -- All reads that can fail come before the first write.
  local window = turn_window(rec, o, summarised[h.meta])
  local win, corrupt = {{}, {}, {}}, nil
  if not h.empty then  -- h.empty: the caller saw the conversation has no history
    win, corrupt = load_window(h.lead, h.turns, h.blobs, window, h.no_lead)
  end
  if not win then
    return {'CORRUPT', corrupt}
  end
  -- Only a run writes a journal (checkpoint) or a continuation (park), and every run
  -- counts an attempt: a turn never started has neither (two reads less).
  local kind, state = false, false
  if tonumber(rec.attempts or '0') > 0 then
    kind, state = saved_state(k)
    if kind == nil then
      return {'CORRUPT', state}
    end
  end
  fence, now = start_run(h, k, rec, runs, holder, fence, o, now)
  if not fence then
    return {'CORRUPT', k.events}
  end
  if expiring then
    -- The runner records its undecided calls as expired and ends it without another
    -- model call: stored, its tool results saying so (engine.Expired).
    rec.expired_ms = istr(now)
    redis.call('HSET', k.turn, 'expired_ms', rec.expired_ms)
  end
  local fields = {}
  for name, value in pairs(rec) do
    fields[#fields + 1] = name
    fields[#fields + 1] = value
  end
  return {'OK', fence, fields, kind, state, win[1], win[2], win[3], peek, window,
    summarised[h.meta] and '1' or '0'}
end

-- After the head turn ended (and left the inbox): free the lease when no turn waits, else
-- keep it (same fence) for the next one. When the next turn is `expected` (its keys nk,
-- the history keys h) it is handed out here, as acquire would. `ahead`: what guard_run()
-- read before the head left (its next and peek then are the inbox now), or nil. Returns the reply of the
-- ending script: {'OK', false} (lease freed; a third item names a turn failed on the
-- way), {'OK', next id, failed id or false} (the caller acquires it with its fence), or
-- {'OK', next id, false, reply of take_head() for it: 'OK' or 'CORRUPT'|'VERSION'}.
local function hand_over(h, k, expected, nk, o, now, ahead)
  if not ahead then
    local queue = redis.call('LRANGE', k.inbox, 0, 1)
    local l = redis.call('HMGET', k.lease, 'fence', 'holder')
    ahead = {fence = l[1], holder = l[2] or '', next = queue[1] or false,
      peek = queue[2] or false}
  end
  local nxt = ahead.next
  if not nxt then
    redis.call('DEL', k.lease)
    return {'OK', false}
  end
  redis.call('HSET', k.lease, 'expires_ms', istr(now + tonumber(o.lease_ms)))
  redis.call('PEXPIRE', k.lease, o.lease_ms)
  if nxt ~= expected then
    return {'OK', nxt}
  end
  local refusal = meta_refusal(h.meta)
  if refusal then
    return {'OK', nxt, false, refusal}
  end
  local taken = take_head(h, nk, nxt, ahead.holder, ahead.fence, o, now, ahead.peek)
  if taken[1] ~= 'DROPPED' then
    return {'OK', nxt, false, taken}
  end
  nxt = redis.call('LINDEX', k.inbox, 0)
  if not nxt then
    redis.call('DEL', k.lease)
  end
  return {'OK', nxt, taken[2]}
end
