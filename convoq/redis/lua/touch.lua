-- KEYS[1 .. n] = the conversation's retained keys (meta, turns, blobs, lead, summary)
-- KEYS[n+1 ..] = keys of the turn just written that expire on their own (e.g. an append id)
-- ARGV[1] = the conversation's idle TTL in ms
-- ARGV[2] = n
-- Refreshes the idle TTL of a conversation after a turn: the retained keys expire once no
-- turn ran for that long; the other keys given expire no later than they do.
-- Returns {'OK', keys refreshed}.
local ttl, n = tonumber(ARGV[1]), tonumber(ARGV[2])
local refreshed = 0
for i, key in ipairs(KEYS) do
  local left = redis.call('PTTL', key)
  if left ~= -2 and (i <= n or left == -1 or left > ttl) then
    refreshed = refreshed + redis.call('PEXPIRE', key, ARGV[1])
  end
end
return {'OK', refreshed}
