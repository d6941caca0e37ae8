#!/usr/bin/env bash
# send_timeout.sh: what a send timeout costs at the demo's burst
# (docs/architecture.md §6.2, issue 23 item 4).
#
# For each timeout in TIMEOUTS, starts a fresh engine with
# `[mq] send_timeout_ms` set to it, runs the demo's burst (no pay phase)
# RUNS times, and prints per run: the share of order-create sends whose
# outcome was UNKNOWN (each is re-sent by the scanner with the same
# message_id), the sends per accepted reservation (1.0 = every reservation
# sent once), the send latency p99 and the end-to-end p99. A fresh engine
# per timeout keeps its send counters to that timeout's runs. Each run's
# orders go unpaid for 10 s and the bench waits until every one is
# canceled and its stock released: a run leaves no delayed cancel or
# compensation behind to load the next (with the 15-minute default, a
# sweep left 100,000 compensation messages that stalled the demo after it).
#
# Knobs: TIMEOUTS ("20 40 60 100 150 200 3000" ms), RUNS (2), STOCK
# (10000), USERS (20000), RATE (20000), BATCH (32), PORT (8091). Needs the
# stack up (scripts/stack.sh up) and a migrated database; builds the
# release binary.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/../../scripts/lib.sh"
cd "$ROOT"

TIMEOUTS="${TIMEOUTS:-20 40 60 100 150 200 3000}"
RUNS="${RUNS:-2}"
STOCK="${STOCK:-10000}"
USERS="${USERS:-20000}"
RATE="${RATE:-20000}"
BATCH="${BATCH:-32}"
PORT="${PORT:-8091}"

command -v jq >/dev/null || apt_install jq
cargo build -q --locked --release -p seckillctl
ctl="$CARGO_TARGET_DIR/release/seckillctl"
out="$STATE_DIR/send-timeout.json"

printf '%-10s %-4s %8s %10s %10s %12s %11s %15s\n' timeout run unknown 'unknown %' 'sends/rsv' 'send p99 ms' 'e2e p99 ms' 'scanner resent'
for timeout in $TIMEOUTS; do
  conf="$STATE_DIR/send-timeout-$timeout.toml"
  write_engine_conf "$conf" "$BATCH"
  printf '[mq]\nsend_timeout_ms = %s\n' "$timeout" >>"$conf"
  start_engine "$ctl" "$conf" "$PORT" "$STATE_DIR/send-timeout-engine.log"
  before_sent=0 before_unknown=0
  for run in $(seq 1 "$RUNS"); do
    activity=$(( $(date +%s%N) / 1000000 ))
    "$ctl" --config "$conf" bench flash-sale --activity "$activity" --sku 1 --stock "$STOCK" \
      --users "$USERS" --rate "$RATE" --engine "http://127.0.0.1:$PORT" --output json \
      --pay-share 0 --pay-within 10s >"$out" 2>/dev/null
    # The engine's counters run on across this timeout's runs: take the
    # difference.
    sent=$(jq '.sends.confirmed + .sends.unknown + .sends.failed' "$out")
    unknown=$(jq '.sends.unknown' "$out")
    accepted=$(jq '.ingress.distinct_reservations' "$out")
    jq -r --arg t "$timeout" --arg run "$run" \
      --argjson sent $((sent - before_sent)) --argjson unknown $((unknown - before_unknown)) \
      --argjson accepted "$accepted" \
      '[$t + " ms", $run,
        ($unknown | tostring),
        (if $sent > 0 then ($unknown * 100 / $sent * 1000 | round / 1000 | tostring) else "-" end),
        (if $accepted > 0 then ($sent / $accepted * 1000 | round / 1000 | tostring) else "-" end),
        (.send_latency_p99_ms * 10 | round / 10 | tostring),
        (.pipeline.end_to_end.p99_ms | round | tostring),
        (.scanner_resent | tostring)] | @tsv' "$out" |
      awk -F'\t' '{ printf "%-10s %-4s %8s %10s %10s %12s %11s %15s\n", $1, $2, $3, $4, $5, $6, $7, $8 }'
    before_sent=$sent before_unknown=$unknown
  done
  kill -TERM "$engine" 2>/dev/null || true
  wait "$engine" 2>/dev/null || true
  trap - EXIT
done
