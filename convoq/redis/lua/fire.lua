-- KEYS[1] = inbox     {prefix}:{cid}:inbox
-- KEYS[2] = timers    {prefix}:{cid}:timers (zset: turn id -> due ms)
-- KEYS[3], KEYS[4] = turn, events of the first turn id of ARGV; then the next pair ...
-- ARGV[1] = events stream MAXLEN (approximate)
-- ARGV[2 ..] = turn ids the caller read as due from the timers zset, in due order
-- Fires the due timers among the turns named: each one still timed and due by the server
-- clock leaves the timers zset (ZREM decides: a timer fires once), and its turn, when it
-- is still scheduled (not cancelled meanwhile), joins the back of the inbox as queued,
-- with its "queued" event and fired_ms. A resent fire finds no timer: nothing changes.
-- Returns {'OK', position of the first turn queued (0: the conversation was idle and
--         needs a kick; -1: none queued), turns queued, server time ms, next due ms or -1,
--         {ms each turn queued was fired after its due time, in the order queued}}
--      or {'CORRUPT', key} (nothing written).
redis.replicate_commands()
local inbox, timers = KEYS[1], KEYS[2]
local n = #ARGV - 1
local bad = wrong_type('list', {inbox}) or wrong_type('zset', {timers})
if bad then
  return {'CORRUPT', bad}
end
local now = now_ms()
local due = {}
for i = 1, n do
  local turn, events = KEYS[1 + 2 * i], KEYS[2 + 2 * i]
  local score = redis.call('ZSCORE', timers, ARGV[1 + i])
  if score and tonumber(score) <= now then
    bad = wrong_type('hash', {turn}) or wrong_type('stream', {events})
    if bad then
      return {'CORRUPT', bad}
    end
    due[#due + 1] = {ARGV[1 + i], turn, events, tonumber(score)}
  end
end
local first, queued, lags = -1, 0, {}
local data = '{"status":"queued","fired_ms":' .. istr(now) .. '}'
for _, t in ipairs(due) do
  local tid, turn, events, due_ms = t[1], t[2], t[3], t[4]
  redis.call('ZREM', timers, tid)
  if redis.call('HGET', turn, 'status') == 'scheduled' then
    local pos = redis.call('RPUSH', inbox, tid) - 1
    if first < 0 then
      first = pos
    end
    queued = queued + 1
    lags[queued] = now - due_ms
    local id = redis.call('XADD', events, 'MAXLEN', '~', ARGV[1], '*', 'type', 'status',
      'data', data)
    redis.call('HSET', turn, 'status', 'queued', 'fired_ms', istr(now), 'last_event', id)
  end
end
local nxt = redis.call('ZRANGE', timers, 0, 0, 'WITHSCORES')
return {'OK', first, queued, istr(now), nxt[2] and tonumber(nxt[2]) or -1, lags}
