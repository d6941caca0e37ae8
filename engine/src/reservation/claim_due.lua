-- claim_due (docs/architecture.md §4, §6): lease a bounded batch of due reservations.
-- Atomic, so two scanners never lease the same reservation; the member's score
-- moves to the lease's end, so it comes due again if this owner dies.
-- The hashes are found through the pending ZSET, so their keys cannot be
-- declared up front; ARGV[5] carries the hash-tagged rsv prefix, which keeps
-- them in the ZSET's slot on Redis Cluster.
-- KEYS: 1 pending
-- ARGV: 1 now_ms, 2 limit, 3 owner, 4 lease_until_ms, 5 rsv key prefix
local now = tonumber(ARGV[1])
local ids = redis.call('ZRANGEBYSCORE', KEYS[1], '-inf', ARGV[1], 'LIMIT', 0, ARGV[2])
local claimed = {}
for _, id in ipairs(ids) do
  local key = ARGV[5] .. id
  local h = redis.call('HMGET', key, 'mq_status', 'lease_until')
  if h[1] == 'MQ_PENDING' or h[1] == 'SENDING' then
    -- An expired SENDING lease means its owner crashed mid-send: take over.
    if (tonumber(h[2]) or 0) <= now then
      redis.call('HSET', key, 'mq_status', 'SENDING', 'lease_owner', ARGV[3],
        'lease_until', ARGV[4])
      redis.call('HINCRBY', key, 'send_attempt', 1)
      redis.call('ZADD', KEYS[1], ARGV[4], id)
      claimed[#claimed + 1] = {id, unpack(redis.call('HGETALL', key))}
    end
  else
    -- Gone (physical TTL) or final: nothing left to send.
    redis.call('ZREM', KEYS[1], id)
  end
end
return claimed
