-- KEYS[1] = inbox     {prefix}:{cid}:inbox
-- KEYS[2] = lease     {prefix}:{cid}:lease
-- KEYS[3] = turn      {prefix}:{cid}:turn:{tid}
-- KEYS[4] = journal   {prefix}:{cid}:journal:{tid}
-- ARGV[1] = turn id
-- ARGV[2] = fence
-- ARGV[3] = TurnState JSON
-- ARGV[4] = turn ttl ms (the journal outlives no turn)
-- Journals the turn so far, fenced like commit.
-- Returns {'OK'} or {'UNKNOWN'|'APPLIED'|'STALE'|'NOT_HEAD'|'NOT_RUNNING'}.
local inbox, lease, turn, journal = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local refused = guard_run(lease, inbox, turn, ARGV[1], ARGV[2], {running = true})
if refused then
  return {refused}
end
redis.call('SET', journal, ARGV[3], 'PX', ARGV[4])
return {'OK'}
