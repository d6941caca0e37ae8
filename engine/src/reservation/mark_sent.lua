-- mark_sent (docs/architecture.md §4): a CAS on message_id and a non-final mq_status, so
-- a late confirmation can never revive a failed or released reservation.
-- KEYS: 1 rsv, 2 pending
-- ARGV: 1 reservation_id, 2 message_id, 3 broker_message_id
local h = redis.call('HMGET', KEYS[1], 'message_id', 'mq_status')
if h[1] ~= ARGV[2] then return 0 end
if h[2] ~= 'MQ_PENDING' and h[2] ~= 'SENDING' then return 0 end
redis.call('HSET', KEYS[1], 'mq_status', 'MQ_SENT', 'broker_message_id', ARGV[3],
  'lease_owner', '', 'lease_until', 0)
redis.call('ZREM', KEYS[2], ARGV[1])
return 1
