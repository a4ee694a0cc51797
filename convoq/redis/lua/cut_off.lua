-- KEYS[1] = lease     {prefix}:{cid}:lease
-- KEYS[2] = inbox     {prefix}:{cid}:inbox
-- KEYS[3] = turn      {prefix}:{cid}:turn:{tid}
-- ARGV[1] = fence: the lease the run was taken with
-- ARGV[2] = turn id: the turn that run ran
-- Reports a run its worker lost while the worker lived: its lease lapsed or was taken
-- over, or Redis could not be reached (a network cut, a stall), and the worker stopped the
-- run. The run is given back (max attempts counts the runs whose worker never reported:
-- crashes) and counted as cut off (`cut_offs`, bounded by max cut-offs apart). Once per
-- run: the turn keeps the newest fence reported (`cut_fence`), and a report for that
-- fence or an older one, for a turn that is not running or parked (queued again by a
-- retry, which sets `cut_fence` to the fence of the time, or finished), or whose runs
-- are all given back already changes nothing: {'SEEN'}. (A report that arrives after a
-- later run's report changes nothing either: that run counts as crashed, which errs on
-- the bounded side.) While the lease is still this run's, it is freed, so the next run
-- starts at once; while no other run holds it, the next run's "resumed" event says
-- worker_cut_off.
-- Returns {'OK', cut-off runs of the turn} / {'SEEN'} / {'UNKNOWN'} / {'CORRUPT', key}.
local lease, inbox, turn, tid = KEYS[1], KEYS[2], KEYS[3], ARGV[2]
local bad = wrong_type('hash', {lease, turn}) or wrong_type('list', {inbox})
  or bad_counters(turn, 'runs', 'cut_offs', 'cut_fence')
if bad then
  return {'CORRUPT', bad}
end
local rec = redis.call('HMGET', turn, 'status', 'runs', 'cut_fence')
if not rec[1] then
  return {'UNKNOWN'}
end
local fence = tonumber(ARGV[1])
if (rec[1] ~= 'running' and not PARKED[rec[1]]) or not fence
    or fence <= tonumber(rec[3] or '0') or tonumber(rec[2] or '0') <= 0 then
  return {'SEEN'}
end
local l = redis.call('HMGET', lease, 'fence', 'state')
local ours = l[1] == ARGV[1] and l[2] == 'active'
redis.call('HINCRBY', turn, 'runs', -1)
local cut = redis.call('HINCRBY', turn, 'cut_offs', 1)
redis.call('HSET', turn, 'cut_fence', ARGV[1])
if ours or not l[1] then
  redis.call('HSET', turn, 'cut_off', '1')
end
if ours and redis.call('LINDEX', inbox, 0) == tid then
  redis.call('DEL', lease)
end
return {'OK', cut}
