-- mark_send_failed (docs/architecture.md §4, §6): a DEFINITE send failure. It leaves the
-- scanner's ZSET, so nothing re-sends it; the stock comes back only through
-- release, the one compensation path.
-- KEYS: 1 rsv, 2 pending
-- ARGV: 1 reservation_id, 2 message_id, 3 last_error
local h = redis.call('HMGET', KEYS[1], 'message_id', 'mq_status')
if h[1] ~= ARGV[2] then return 0 end
if h[2] ~= 'MQ_PENDING' and h[2] ~= 'SENDING' then return 0 end
redis.call('HSET', KEYS[1], 'mq_status', 'SEND_FAILED', 'last_error', ARGV[3],
  'lease_owner', '', 'lease_until', 0)
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
