-- retire (docs/architecture.md §16.3): an ended sale leaves Redis. One
-- script in the activity's slot, so a reservation still waiting for its
-- send is seen and the retirement waits for it: once the epoch is gone
-- nothing can be admitted, and the scanner no longer looks here.
-- KEYS: 1 epoch, 2 pending, 3 buyers, 4.. the stock key of every SKU
-- ARGV: 1 the TTL in ms the stock and buyers keys keep, for late releases
--       and reads
local pending = redis.call('ZCARD', KEYS[2])
if pending > 0 then return {'PENDING', pending} end
-- The fence: an engine that cannot reach PostgreSQL and still believes the
-- sale is open gets NO_EPOCH from reserve and admits nothing.
redis.call('DEL', KEYS[1])
for i = 3, #KEYS do
  if redis.call('EXISTS', KEYS[i]) == 1 then
    redis.call('PEXPIRE', KEYS[i], ARGV[1])
  end
end
return {'RETIRED', 0}
