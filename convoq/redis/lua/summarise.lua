-- KEYS[1] = meta      {prefix}:{cid}:meta
-- KEYS[2] = turns     {prefix}:{cid}:turns
-- KEYS[3] = summary   {prefix}:{cid}:summary
-- ARGV[1] = summary text (as sent)
-- ARGV[2] = watermark: the turns it covers, from the first stored one
-- ARGV[3] = its version
-- ARGV[4] = basis: the stored turns it was made from (the meta 'turns' counter)
-- ARGV[5] = basis: sha1 of the last stored element ('' when none)
-- ARGV[6] = basis: the version of the summary it replaces ('0': none)
-- Commits a rolling summary and its watermark in one write, only if the history and the
-- previous summary are still those it was made from (a turn appended, a prune, a clear
-- or another summary meanwhile refuses it).
-- Returns {'OK'} or {'CHANGED'} (nothing written) / {'VERSION', v} / {'CORRUPT', key}.
local meta, turns, summary = KEYS[1], KEYS[2], KEYS[3]
local bad = bad_version(meta)
if bad then
  return {'VERSION', bad}
end
local corrupt = wrong_type('hash', {meta, summary}) or wrong_type('list', {turns})
if corrupt then
  return {'CORRUPT', corrupt}
end
local stored = redis.call('HGET', meta, 'turns') or '0'
local last = redis.call('LINDEX', turns, -1)
local last_sha = ''
if last then
  last_sha = redis.sha1hex(last)
end
local version = redis.call('HGET', summary, 'version') or '0'
if stored ~= ARGV[4] or last_sha ~= ARGV[5] or version ~= ARGV[6] then
  return {'CHANGED'}
end
redis.call('HSET', summary, 'text', ARGV[1], 'watermark', ARGV[2], 'version', ARGV[3])
-- Read along with the format check when a turn is handed out (take_head() in _lib.lua).
redis.call('HSET', meta, 'summarised', '1')
local ttl = redis.call('PTTL', turns)
if ttl > 0 then
  redis.call('PEXPIRE', summary, ttl)  -- an idle TTL covers the summary too
end
return {'OK'}
