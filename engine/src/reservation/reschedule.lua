-- reschedule (docs/architecture.md §4, §6): hand a lease back after an UNKNOWN send.
-- Only the current lease holder may, so an owner whose lease expired and was
-- taken over cannot push the new owner's reservation around.
-- KEYS: 1 rsv, 2 pending
-- ARGV: 1 reservation_id, 2 message_id, 3 owner, 4 next_retry_at_ms, 5 last_error
local h = redis.call('HMGET', KEYS[1], 'message_id', 'mq_status', 'lease_owner')
if h[1] ~= ARGV[2] or h[2] ~= 'SENDING' or h[3] ~= ARGV[3] then return 0 end
redis.call('HSET', KEYS[1], 'mq_status', 'MQ_PENDING', 'next_retry_at', ARGV[4],
  'last_error', ARGV[5], 'lease_owner', '', 'lease_until', 0)
redis.call('ZADD', KEYS[2], ARGV[4], ARGV[1])
return 1
