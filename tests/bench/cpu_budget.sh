#!/usr/bin/env bash
# cpu_budget.sh: where the CPU of a flash-sale burst goes, per component.
#
# Runs the demo's burst (no pay phase) RUNS times against a fresh engine and
# prints, per run, the bench figures and the CPU seconds each process spent
# from the first request until the pipeline was quiet: the engine, PostgreSQL
# (every backend, autovacuum included), the broker, Redis and the bench
# itself. On a 2-core box the sum is the budget: seconds of wall time x 2.
# Divide by the orders to get microseconds per order per component, which
# is what bounds the order rate once every part shares the same cores.
#
# Knobs: RUNS (3), STOCK (10000), USERS (20000), RATE (20000), BATCH (32),
# PORT (8090). Needs the stack up (scripts/stack.sh up) and a migrated
# database; builds the release binary.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
cd "$ROOT"

RUNS="${RUNS:-3}"
STOCK="${STOCK:-10000}"
USERS="${USERS:-20000}"
RATE="${RATE:-20000}"
BATCH="${BATCH:-32}"
PORT="${PORT:-8090}"

for tool in jq bc; do command -v "$tool" >/dev/null || apt_install "$tool"; done
[ -x /usr/bin/time ] || apt_install time
cargo build -q --locked --release -p seckillctl
ctl="$CARGO_TARGET_DIR/release/seckillctl"
# The engine runs under its own file name so its CPU is told apart from the
# bench's (same binary); /proc names a process by its executable.
mkdir -p "$STATE_DIR/bin"
engine_bin="$STATE_DIR/bin/seckill-engine"
cp "$ctl" "$engine_bin"
conf="$STATE_DIR/cpu-budget.toml"
write_engine_conf "$conf" "$BATCH"

# CPU ticks (user + system) per executable name, over live processes.
ticks() {
  local f
  for f in /proc/[0-9]*/stat; do
    cat "$f" 2>/dev/null || true
  done | sed -E 's/^[0-9]+ \((.*)\) [A-Za-z] (.*)$/\1 \2/' |
    awk '{ name = $1; sub(/:.*/, "", name); t[name] += $12 + $13 } END { for (k in t) print k, t[k] }' |
    sort
}

start_engine "$engine_bin" "$conf" "$PORT" "$STATE_DIR/cpu-budget-engine.log"

hz=$(getconf CLK_TCK)
for run in $(seq 1 "$RUNS"); do
  activity=$(( $(date +%s%N) / 1000000 ))
  before=$(ticks)
  started=$(date +%s.%N)
  /usr/bin/time -f 'bench %U %S' -o "$STATE_DIR/cpu-budget-bench.time" \
    "$ctl" --config "$conf" bench flash-sale --activity "$activity" --sku 1 --stock "$STOCK" \
    --users "$USERS" --rate "$RATE" --engine "http://127.0.0.1:$PORT" --output json \
    >"$STATE_DIR/cpu-budget-bench.json" 2>/dev/null
  wall=$(echo "$(date +%s.%N) - $started" | bc)
  after=$(ticks)
  orders=$(jq -r '.pipeline.outcomes.ORDER_CREATED // 0' "$STATE_DIR/cpu-budget-bench.json")
  echo "run $run: $(jq -r '"consume \(.pipeline.consume_rate | floor)/s, end to end p50/p99/p99.9 \(.pipeline.end_to_end.p50_ms)/\(.pipeline.end_to_end.p99_ms)/\(.pipeline.end_to_end.p999_ms) ms"' "$STATE_DIR/cpu-budget-bench.json"), $orders orders, wall ${wall} s"
  {
    join <(echo "$before") <(echo "$after") |
      awk -v hz="$hz" '$3 - $2 > 0 { printf "%s %.2f\n", $1, ($3 - $2) / hz }'
    awk '{ printf "%s %.2f\n", $1, $2 + $3 }' "$STATE_DIR/cpu-budget-bench.time"
  } | awk -v n="$orders" '$1 ~ /^(seckill-engine|postgres|rocketmq-broker|redis-server|bench)$/ {
        printf "  %-16s %6.2f cpu-s  %5.0f us/order\n", $1, $2, (n > 0 ? $2 * 1e6 / n : 0); total += $2 }
      END { printf "  %-16s %6.2f cpu-s  %5.0f us/order\n", "total", total, (n > 0 ? total * 1e6 / n : 0) }'
  # Let the outbox drain what it held back before the next burst.
  for _ in $(seq 1 120); do
    due=$(psql "$SECKILL_DATABASE_URL" -tAc "SELECT count(*) FROM event_outbox WHERE status = 'PENDING' AND next_attempt_at <= now()")
    [ "$due" = 0 ] && break
    sleep 1
  done
done
