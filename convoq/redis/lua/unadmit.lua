-- KEYS[1] = members   {prefix}:{~queued}:members  "cid tid" -> "admitted_ms agent"
-- KEYS[2] = counts    {prefix}:{~queued}:counts   agent -> n, "*" -> n
-- ARGV[1..n] = members to uncount (finished turns, or refused submits)
-- Uncounts admitted turns. A member not admitted (never, or already uncounted) changes
-- nothing, so a replay or a second caller for the same turn is harmless.
-- Returns {'OK', how many were uncounted}.
local members, counts = KEYS[1], KEYS[2]
local done = 0
for _, member in ipairs(ARGV) do
  local value = redis.call('HGET', members, member)
  if value then
    local agent = string.sub(value, string.find(value, ' ', 1, true) + 1)
    redis.call('HDEL', members, member)
    if redis.call('HINCRBY', counts, '*', -1) <= 0 then
      redis.call('HDEL', counts, '*')
    end
    if redis.call('HINCRBY', counts, agent, -1) <= 0 then
      redis.call('HDEL', counts, agent)
    end
    done = done + 1
  end
end
return {'OK', done}
