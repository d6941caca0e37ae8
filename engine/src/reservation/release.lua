-- release (docs/architecture.md §4, §8): the compensation. mq_status=RELEASED is the
-- once-only mark checked and set in the same script, so concurrent or repeated
-- calls give the stock back and free the buyer exactly once.
-- KEYS: 1 rsv, 2 stock (of the hash's sku, read by the caller), 3 buyers, 4 pending
-- ARGV: 1 reservation_id, 2 sku_id the stock key was built from
local h = redis.call('HMGET', KEYS[1], 'mq_status', 'sku_id', 'user_id')
if not h[1] then return 'UNKNOWN' end
if h[1] == 'RELEASED' then return 'ALREADY_RELEASED' end
if h[2] ~= ARGV[2] then return 'SKU_MISMATCH' end
-- A retired activity's stock key expires a day after its retirement
-- (docs/architecture.md §16.3). INCR would create it again with no TTL,
-- holding memory for good; nothing can be sold from it any more, so the
-- unit has nowhere to go back to.
if redis.call('EXISTS', KEYS[2]) == 0 then return 'UNKNOWN' end
redis.call('INCR', KEYS[2])
redis.call('SREM', KEYS[3], h[3])
redis.call('HSET', KEYS[1], 'mq_status', 'RELEASED', 'lease_owner', '', 'lease_until', 0)
redis.call('ZREM', KEYS[4], ARGV[1])
return 'RELEASED'
