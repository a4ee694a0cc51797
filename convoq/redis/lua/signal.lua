-- KEYS[1] = inbox     {prefix}:{cid}:inbox
-- KEYS[2] = lease     {prefix}:{cid}:lease
-- KEYS[3] = turn      {prefix}:{cid}:turn:{head}  (head: ARGV[1]; any turn key when '')
-- KEYS[4] = events    {prefix}:{cid}:events:{head}
-- KEYS[5] = kept      {prefix}:{cid}:signal:{sha256(name)}
-- KEYS[6] = seen      {prefix}:{cid}:signals:seen
-- ARGV[1] = the inbox head the caller saw ('' when none)
-- ARGV[2] = signal name
-- ARGV[3] = payload: the JSON text the waiting call's result becomes
-- ARGV[4] = signal id (a resend of the same signal carries the same id)
-- ARGV[5] = most signals kept per conversation and name
-- ARGV[6] = how long a kept signal (and a signal id, against resends) is kept, ms
-- ARGV[7] = events stream MAXLEN (approximate)
-- ARGV[8] = who sent it ('' for nobody named)
-- Delivers a signal to the turn of the conversation that waits for it: the parked inbox
-- head's first undecided call waiting for this name takes it (one signal, one wait); the
-- last missing decision marks the turn for resumption (the caller kicks it). With no wait
-- for it, the signal is kept (oldest first, at most ARGV[5] live ones, each for ARGV[6]
-- ms) for the next wait on that name (park.lua takes it). A signal id seen before writes
-- nothing (a resend after a lost reply, or the sender's own retry).
-- Returns {'DELIVERED', call id, 'PENDING'} / {'DELIVERED', call id, 'RESUME', agent}
--      (agent: the one the turn's record names, false for none: where its kick goes)
--      or {'KEPT', live signals kept}
--      or {'SEEN', the inbox head or '', its agent or false (known when it is the head the
--         caller saw)} (this signal id was handled before: nothing written)
--      or {'RETRY', head or ''} (the head is another turn: call again with its keys)
--      or {'FULL', kept} (as many live signals kept as allowed: nothing written)
--      or {'CORRUPT', key} (nothing written).
redis.replicate_commands()
local inbox, lease, turn, events, kept, seen = KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5], KEYS[6]
local queue = touch(inbox, 'LRANGE', inbox, 0, 0)
if queue == nil then
  return {'CORRUPT', inbox}
end
local bad = wrong_type('hash', {lease, turn}) or wrong_type('stream', {events})
  or wrong_type('zset', {seen})
if bad then
  return {'CORRUPT', bad}
end
local now = now_ms()
if redis.call('ZSCORE', seen, ARGV[4]) then
  local agent = queue[1] and queue[1] == ARGV[1] and redis.call('HGET', turn, 'agent')
  return {'SEEN', queue[1] or '', agent or false}
end
if (queue[1] or '') ~= ARGV[1] then
  return {'RETRY', queue[1] or ''}
end
local list = touch(kept, 'LRANGE', kept, 0, -1)
if list == nil then
  return {'CORRUPT', kept}
end
local ttl = tonumber(ARGV[6])
-- The waiting call: the head parked (its lease not expired), undecided, this name.
local target = nil
if queue[1] then
  local rec = redis.call('HMGET', turn, 'status', 'pending', 'resume', 'waits', 'agent')
  local state = redis.call('HGET', lease, 'state')
  if PARKED[rec[1]] and rec[3] ~= '1' and state == 'parked' then
    local ok_p, pending = pcall(cjson.decode, rec[2] or '[]')
    local ok_w, waits = pcall(cjson.decode, rec[4] or '{}')
    if not (ok_p and ok_w and type(pending) == 'table' and type(waits) == 'table') then
      return {'CORRUPT', turn}
    end
    local undecided = 0
    for _, id in ipairs(pending) do
      if redis.call('HEXISTS', turn, 'decision:' .. id) == 0 then
        undecided = undecided + 1
        local w = waits[id]
        if not target and type(w) == 'table' and w.on == 'signal' and w.name == ARGV[2] then
          target = id
        end
      end
    end
    if target then
      local by = ARGV[8] ~= '' and ARGV[8] or cjson.null
      local decision = {approved = true, by = by, at_ms = now, expired = false,
        result = ARGV[3], is_error = false}
      local data = cjson.encode({call_id = target, signal = ARGV[2], id = ARGV[4], by = by,
        sent_ms = now, at_ms = now})
      redis.call('XADD', events, 'MAXLEN', '~', ARGV[7], '*', 'type', 'signal_delivered',
        'data', data)
      redis.call('HSET', turn, 'decision:' .. target, cjson.encode(decision))
      redis.call('ZADD', seen, istr(now + ttl), ARGV[4])
      redis.call('ZREMRANGEBYSCORE', seen, '-inf', istr(now))
      redis.call('PEXPIRE', seen, ttl)
      if undecided > 1 then
        return {'DELIVERED', target, 'PENDING'}
      end
      redis.call('HSET', turn, 'resume', '1')
      redis.call('DEL', lease)
      return {'DELIVERED', target, 'RESUME', rec[5] or false}
    end
  end
end
-- Nobody waits for it: keep it, after the ones whose time ran out (they are dropped).
local stale, live = 0, 0
for i, raw in ipairs(list) do
  local ok_e, entry = pcall(cjson.decode, raw)
  if ok_e and type(entry) == 'table' and tonumber(entry.exp_ms or 0) > now then
    live = live + 1
  elseif live == 0 then
    stale = i
  end
end
if live >= tonumber(ARGV[5]) then
  return {'FULL', live}
end
if stale > 0 then
  redis.call('LTRIM', kept, stale, -1)
end
local by = ARGV[8] ~= '' and ARGV[8] or cjson.null
redis.call('RPUSH', kept, cjson.encode({id = ARGV[4], payload = ARGV[3], by = by,
  at_ms = now, exp_ms = now + ttl}))
redis.call('PEXPIRE', kept, ttl)
redis.call('ZADD', seen, istr(now + ttl), ARGV[4])
redis.call('ZREMRANGEBYSCORE', seen, '-inf', istr(now))
redis.call('PEXPIRE', seen, ttl)
return {'KEPT', live + 1}
