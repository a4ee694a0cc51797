-- KEYS[1] = meta      {prefix}:{cid}:meta
-- KEYS[2] = turns     {prefix}:{cid}:turns
-- KEYS[3] = blobs     {prefix}:{cid}:blobs
-- KEYS[4] = lead      {prefix}:{cid}:lead
-- KEYS[5] = applied   {prefix}:{cid}:append:{pop id}
-- KEYS[6] = inbox     {prefix}:{cid}:inbox
-- KEYS[7] = lease     {prefix}:{cid}:lease
-- KEYS[8] = summary   {prefix}:{cid}:summary
-- ARGV[1] = how long the pop id is remembered, ms (longer than any resend takes)
-- ARGV[2] = 'turns' or 'lead': the list whose last element holds the newest message (lead
--           only while the turns list is empty); 'none': the caller found both empty
-- ARGV[3] = sha1 of that element as the caller read it
-- ARGV[4] = the element stored in its place (it less its newest message), or '' (it goes)
-- ARGV[5 ..] = sha256, bytes, ...: attachments ARGV[4] refers to that the old element did not
-- Removes the newest message of a conversation (memory API) in one step: the last element
-- of the list is dropped or replaced, whatever the history's length (LINDEX, RPOP/LSET,
-- never a range). A writer's turn holds the conversation's lease, and a queued turn sits in
-- the inbox: either answers BUSY (the caller waits and asks again), as prune and clear do.
-- The element must still be the one the caller read (else CHANGED: read it again), so a
-- plain append in between is never lost. Attachments stay in the blobs hash (another
-- element may share one; prune drops those no element refers to), unless nothing is left
-- to refer to any. A summary covering the turn the message left is dropped (it told of it).
-- Exactly once per pop id: a resend (the reply was lost) finds the id and writes nothing.
-- Returns {'OK'} / {'APPLIED'} (a resend) / {'EMPTY'} (nothing stored, as the caller found) /
-- {'CHANGED'} / {'BUSY'} or {'VERSION', v} / {'CORRUPT', key} (nothing written).
local meta, turns, blobs, lead = KEYS[1], KEYS[2], KEYS[3], KEYS[4]
local applied, inbox, lease, summary = KEYS[5], KEYS[6], KEYS[7], KEYS[8]
if redis.call('EXISTS', applied) == 1 then
  return {'APPLIED'}
end
local bad = bad_version(meta)
if bad then
  return {'VERSION', bad}
end
local corrupt = wrong_type('list', {turns, lead, inbox}) or wrong_type('hash', {blobs, summary})
  or bad_counters(meta, 'turns', 'bytes') or bad_counters(summary, 'watermark')
if corrupt then
  return {'CORRUPT', corrupt}
end
if redis.call('LLEN', inbox) > 0 or redis.call('EXISTS', lease) == 1 then
  return {'BUSY'}
end
local n = redis.call('LLEN', turns)
local list = turns
if ARGV[2] == 'none' then
  -- An empty conversation answers only when no turn holds it (checked above): a running
  -- turn may be about to store what the caller would pop.
  if n > 0 or redis.call('LLEN', lead) > 0 then
    return {'CHANGED'}
  end
  return {'EMPTY'}
end
if ARGV[2] == 'lead' then
  if n > 0 then
    return {'CHANGED'}
  end
  list = lead
end
local old = redis.call('LINDEX', list, -1)
if not old or redis.sha1hex(old) ~= ARGV[3] then
  return {'CHANGED'}
end
local kind = element_header(old)
if not kind then
  return {'CORRUPT', list}
end
-- The first element of the turns list starts a turn whatever its kind (as in prune).
local starts = 0
local covered = false
if list == turns then
  local was = (kind == 'T' or n == 1) and 1 or 0
  local now = 0
  if ARGV[4] ~= '' and (string.sub(ARGV[4], 1, 1) == 'T' or n == 1) then
    now = 1
  end
  starts = now - was
  local watermark = redis.call('HGET', summary, 'watermark')
  local stored = redis.call('HGET', meta, 'turns')
  covered = watermark ~= false and stored ~= false and tonumber(watermark) >= tonumber(stored)
end
-- Checks done; only writes that cannot fail from here on.
if ARGV[4] == '' then
  redis.call('RPOP', list)
else
  redis.call('LSET', list, -1, ARGV[4])
end
local size = string.len(ARGV[4]) - string.len(old) + store_blobs(blobs, 5)
if redis.call('EXISTS', meta) == 1 then
  if redis.call('LLEN', turns) == 0 and redis.call('LLEN', lead) == 0 then
    -- Nothing is left that could refer to an attachment.
    redis.call('DEL', blobs)
    redis.call('HSET', meta, 'bytes', 0, 'turns', 0)
  else
    redis.call('HINCRBY', meta, 'bytes', istr(size))
    if starts ~= 0 then
      redis.call('HINCRBY', meta, 'turns', istr(starts))
    end
  end
end
if covered then
  redis.call('DEL', summary)
end
redis.call('SET', applied, '1', 'PX', ARGV[1])
return {'OK'}
