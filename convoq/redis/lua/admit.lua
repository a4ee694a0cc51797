-- KEYS[1] = members   {prefix}:{~queued}:members  "cid tid" -> "admitted_ms agent"
-- KEYS[2] = counts    {prefix}:{~queued}:counts   agent -> n, "*" -> n
-- ARGV[1] = member    "cid tid" (encoded conversation id, a space, the turn id)
-- ARGV[2] = agent name
-- ARGV[3] = the most turns admitted in all (0: no limit)
-- ARGV[4] = the most turns admitted per agent (0: no limit)
-- Admits a turn against the deployment-wide limits: checks both counts, then counts it.
-- A member already admitted (a resent call) is admitted again without counting twice.
-- Returns {'OK'} or {'FULL', 'total' or 'agent', count} (nothing written).
redis.replicate_commands()
local members, counts = KEYS[1], KEYS[2]
local member, agent = ARGV[1], ARGV[2]
local max_total, max_agent = tonumber(ARGV[3]), tonumber(ARGV[4])
if redis.call('HEXISTS', members, member) == 1 then
  return {'OK'}
end
local total = tonumber(redis.call('HGET', counts, '*') or '0')
if max_total > 0 and total >= max_total then
  return {'FULL', 'total', istr(total)}
end
local mine = tonumber(redis.call('HGET', counts, agent) or '0')
if max_agent > 0 and mine >= max_agent then
  return {'FULL', 'agent', istr(mine)}
end
redis.call('HSET', members, member, istr(now_ms()) .. ' ' .. agent)
redis.call('HINCRBY', counts, '*', 1)
redis.call('HINCRBY', counts, agent, 1)
return {'OK'}
