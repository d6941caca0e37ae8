#!/usr/bin/env bash
# growth.sh: does a sale cost the same after twenty others? (issue 24,
# docs/architecture.md §16).
#
# One release engine and one database of its own run a warm-up sale (shown,
# not counted), then SALES back-to-back sales of STOCK orders each, USERS
# buyers at RATE requests/s; PAY_SHARE of each sale's orders are paid and
# the rest cancel after PAY_WITHIN, so every sale leaves its full history
# behind (orders, inbox, outbox, ledger, compensations) and ends, as
# `bench flash-sale` does. Each sale prints its consume rate, end-to-end
# p99.9 and the engine's resident memory. The verdict fits a least-squares
# line through the counted sales and compares its last value with its first:
# rate and p99.9 within LIMIT (0.10), and memory not growing by more than
# LIMIT either. On two shared cores one sale's rate spreads by about 10 %
# with no trend at all, so two single sales are printed but not judged.
#
# Knobs: SALES (20), STOCK (10000), USERS (20000), RATE (20000), BATCH (32),
# PAY_SHARE (0.5), PAY_WITHIN (5s), LIMIT (0.10), PORT (8091), SECKILLCTL
# (a built binary; default: build release). Needs the
# stack up (scripts/stack.sh up); builds the release binary. Exit 0 PASS,
# 1 FAIL.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
cd "$ROOT"

SALES="${SALES:-20}"
STOCK="${STOCK:-10000}"
USERS="${USERS:-20000}"
RATE="${RATE:-20000}"
BATCH="${BATCH:-32}"
PAY_SHARE="${PAY_SHARE:-0.5}"
PAY_WITHIN="${PAY_WITHIN:-5s}"
LIMIT="${LIMIT:-0.10}"
PORT="${PORT:-8091}"

for tool in jq bc; do command -v "$tool" >/dev/null || apt_install "$tool"; done
# SECKILLCTL names an already built binary (a smoke run on a debug build);
# the figures are a release build's.
if [ -n "${SECKILLCTL:-}" ]; then
  ctl=$SECKILLCTL
else
  log "building seckillctl (release)"
  cargo build -q --locked --release -p seckillctl
  ctl="$CARGO_TARGET_DIR/release/seckillctl"
fi

# Its own database, Redis prefix and topics: the history it grows is its own.
db="seckill_growth_$(date +%s)"
export SECKILL_DATABASE_URL="postgres://postgres@$PG_HOST:$PG_PORT/$db"
export SECKILL_TOPIC_PREFIX="growth$(date +%s)_"
psql "postgres://postgres@$PG_HOST:$PG_PORT/postgres" -qc "CREATE DATABASE $db" >/dev/null
conf="$STATE_DIR/growth.toml"
write_engine_conf "$conf" "$BATCH"
printf 'redis_prefix = "%s"\n' "$db" >>"$conf"
"$ctl" --config "$conf" db migrate >/dev/null
"$ctl" --config "$conf" mq setup --wait 60s >/dev/null
log "database $db, topic prefix $SECKILL_TOPIC_PREFIX"

start_engine "$ctl" "$conf" "$PORT" "$STATE_DIR/growth-engine.log"
rss_mib() { awk '/^VmRSS:/ { printf "%d", $2 / 1024 }' "/proc/$engine/status"; }

results="$STATE_DIR/growth.tsv"
: >"$results"
printf '%-8s %10s %14s %10s %8s\n' sale "consume/s" "e2e p99.9 ms" "RSS MiB" orders
for sale in $(seq 0 "$SALES"); do
  activity=$(( $(date +%s%N) / 1000000 ))
  "$ctl" --config "$conf" bench flash-sale --activity "$activity" --sku 1 --stock "$STOCK" \
    --users "$USERS" --rate "$RATE" --pay-share "$PAY_SHARE" --pay-within "$PAY_WITHIN" \
    --engine "http://127.0.0.1:$PORT" --output json >"$STATE_DIR/growth-sale.json" 2>/dev/null
  rate=$(jq -r '.pipeline.consume_rate | floor' "$STATE_DIR/growth-sale.json")
  p999=$(jq -r '.pipeline.end_to_end.p999_ms' "$STATE_DIR/growth-sale.json")
  orders=$(jq -r '.pipeline.outcomes.ORDER_CREATED // 0' "$STATE_DIR/growth-sale.json")
  rss=$(rss_mib)
  label=$([ "$sale" = 0 ] && echo warm-up || echo "$sale")
  printf '%-8s %10s %14s %10s %8s\n' "$label" "$rate" "$p999" "$rss" "$orders"
  [ "$sale" = 0 ] || printf '%s\t%s\t%s\t%s\n' "$sale" "$rate" "$p999" "$rss" >>"$results"
done

history=$(psql "$SECKILL_DATABASE_URL" -tAc \
  "SELECT (SELECT count(*) FROM orders) || ' orders, ' || (SELECT count(*) FROM consumer_inbox) || ' inbox rows, ' || (SELECT count(*) FROM event_outbox) || ' outbox rows; ' || (SELECT count(*) FROM activities WHERE retired_at IS NULL) || ' activities not retired'")
log "history left behind: $history"

# The least-squares line through column $1 over the counted sales: its value
# at the last sale divided by its value at the first.
trend() {
  awk -v c="$1" '{ x = $1; y = $c; n++; sx += x; sy += y; sxx += x * x; sxy += x * y; last = x; if (n == 1) first = x }
    END { b = (n * sxy - sx * sy) / (n * sxx - sx * sx); a = (sy - b * sx) / n;
          printf "%.3f", (a + b * last) / (a + b * first) }' "$results"
}
raw() { awk -v c="$1" 'NR == 1 { f = $c } { l = $c } END { printf "%.3f", l / f }' "$results"; }
rate_t=$(trend 2); p999_t=$(trend 3); rss_t=$(trend 4)
echo "fitted trend, last / first sale: consume rate x$rate_t, e2e p99.9 x$p999_t, engine RSS x$rss_t"
echo "raw sale $SALES / sale 1: consume rate x$(raw 2), e2e p99.9 x$(raw 3), engine RSS x$(raw 4)"

fail=0
ok() { [ "$(echo "$1" | bc -l)" = 1 ]; }
ok "$rate_t >= 1 - $LIMIT" || { echo "FAIL: the consume rate fell by more than $LIMIT"; fail=1; }
ok "$p999_t <= 1 + $LIMIT" || { echo "FAIL: e2e p99.9 grew by more than $LIMIT"; fail=1; }
ok "$rss_t <= 1 + $LIMIT" || { echo "FAIL: the engine's memory grew by more than $LIMIT"; fail=1; }
[ "$fail" = 0 ] && echo "PASS" || exit 1
