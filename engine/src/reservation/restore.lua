-- restore (docs/architecture.md §4.5): an activity's Redis state rebuilt from
-- PostgreSQL after Redis lost it. One script, so the activity reopens (its
-- epoch appears) only with its stock and buyers in place, and a crash half
-- way leaves it closed for the operator to run the restore again.
-- KEYS: 1 buyers, 2 epoch, 3.. the stock key of each SKU
-- ARGV: 1 epoch, 2..(1+#stock keys) each SKU's stock, then the buyers
local skus = #KEYS - 2
redis.call('DEL', KEYS[1])
local i = 2 + skus
while i <= #ARGV do
  -- SADD in slices: Lua's stack cannot unpack a sale's worth of buyers at once.
  local last = math.min(i + 499, #ARGV)
  redis.call('SADD', KEYS[1], unpack(ARGV, i, last))
  i = last + 1
end
for k = 1, skus do
  redis.call('SET', KEYS[2 + k], ARGV[1 + k])
end
redis.call('SET', KEYS[2], ARGV[1])
return skus
