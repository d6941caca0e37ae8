-- reserve (docs/architecture.md §4). One script, so the stock unit, the buyer mark, the
-- hash, the request key and the pending entry appear together or not at all:
-- a crash can never leave stock taken without a pending entry for the scanner.
-- KEYS: 1 req, 2 stock, 3 buyers, 4 rsv, 5 pending, 6 epoch
-- ARGV: 1 reservation_id, 2 message_id, 3 request_id, 4 order_id, 5 sku_id,
--       6 user_id, 7 now_ms, 8 valid_until_ms, 9 first_retry_at_ms, 10 ttl_ms,
--       11 trace_id (docs/architecture.md §11.5: re-sends keep the trace),
--       12 '1' when the sale has ended (docs/architecture.md §16.3)
local existing = redis.call('GET', KEYS[1])
if existing then return {'EXISTING', existing} end
-- After the request key: a client retrying a request it made before the
-- end still gets its reservation back; only new requests are refused.
if ARGV[12] == '1' then return {'ENDED'} end
-- No epoch: never seeded, or Redis lost the activity's state (a restart
-- without persistence, a failover that missed writes). Admitting against
-- whatever stock is left would oversell; the caller asks PostgreSQL which
-- (docs/architecture.md §4.5).
if redis.call('EXISTS', KEYS[6]) == 0 then return {'NO_EPOCH'} end
local stock = redis.call('GET', KEYS[2])
if not stock then return {'NOT_SEEDED'} end
if tonumber(stock) <= 0 then return {'SOLD_OUT'} end
if redis.call('SISMEMBER', KEYS[3], ARGV[6]) == 1 then return {'DUPLICATE_USER'} end
-- Overwriting a live hash would lose track of the stock unit it holds.
if redis.call('EXISTS', KEYS[4]) == 1 then return {'ID_IN_USE'} end

redis.call('DECR', KEYS[2])
redis.call('SADD', KEYS[3], ARGV[6])
redis.call('HSET', KEYS[4],
  'message_id', ARGV[2], 'request_id', ARGV[3], 'order_id', ARGV[4],
  'sku_id', ARGV[5], 'user_id', ARGV[6],
  'mq_status', 'MQ_PENDING', 'send_attempt', 0, 'next_retry_at', ARGV[9],
  'lease_owner', '', 'lease_until', 0,
  'created_at', ARGV[7], 'valid_until', ARGV[8],
  'broker_message_id', '', 'last_error', '', 'trace_id', ARGV[11])
redis.call('PEXPIRE', KEYS[4], ARGV[10])
redis.call('SET', KEYS[1], ARGV[1], 'PX', ARGV[10])
redis.call('ZADD', KEYS[5], ARGV[9], ARGV[1])
return {'RESERVED'}
