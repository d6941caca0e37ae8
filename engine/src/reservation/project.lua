-- project (docs/architecture.md §8.7): the query view of one reservation's order. Written
-- only by an event whose aggregate_version is newer than the one held, so a
-- replayed or reordered stale event never overwrites a newer status.
-- KEYS: 1 view
-- ARGV: 1 aggregate_version, 2 status, 3 order_id, 4 occurred_at_ms, 5 ttl_ms
local held = tonumber(redis.call('HGET', KEYS[1], 'aggregate_version') or '0')
if tonumber(ARGV[1]) <= held then return 0 end
redis.call('HSET', KEYS[1], 'aggregate_version', ARGV[1], 'status', ARGV[2],
  'order_id', ARGV[3], 'occurred_at', ARGV[4])
redis.call('PEXPIRE', KEYS[1], ARGV[5])
return 1
