#!/usr/bin/env bash
# The README's first command: a real flash sale through Redis, RocketMQ and
# PostgreSQL. Brings the stack up, migrates, starts the engine, offers a burst
# of reservations, waits for the pipeline to go quiet, prints the bench
# summary and the reconcile verdict, and stops the engine.
#
# Knobs (environment): DEMO_STOCK (10000), DEMO_USERS (20000), DEMO_RATE (20000),
# DEMO_BATCH (the publisher and consumer batch size, 32; 1 = per message),
# DEMO_PAY_SHARE (0.5 of the orders are paid), DEMO_PAY_WITHIN (20s: the
# unpaid rest visibly cancel and give their stock back before reconcile),
# DEMO_PLOT (the sale's timeline as SVG, $STATE_DIR/demo-sale.svg).
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"

STOCK="${DEMO_STOCK:-10000}"
USERS="${DEMO_USERS:-20000}"
RATE="${DEMO_RATE:-20000}"
BATCH="${DEMO_BATCH:-32}"
PORT="${DEMO_PORT:-8080}"
PAY_SHARE="${DEMO_PAY_SHARE:-0.5}"
PAY_WITHIN="${DEMO_PAY_WITHIN:-20s}"
PLOT="${DEMO_PLOT:-$STATE_DIR/demo-sale.svg}"

started=$SECONDS
log "building seckillctl (release)"
cargo build -q --locked --release -p seckillctl
ctl="$CARGO_TARGET_DIR/release/seckillctl"

SECKILLCTL="$ctl" "$ROOT/scripts/stack.sh" up

log "seckillctl db migrate"
"$ctl" db migrate

log "seckillctl health --components-only"
"$ctl" health --components-only

# A fresh activity id per run: the bench refuses to re-seed an activity with orders.
activity=$(date +%s)
conf="$STATE_DIR/demo.toml"
write_engine_conf "$conf" "$BATCH"

log "starting the engine on 127.0.0.1:$PORT (batch size $BATCH)"
start_engine "$ctl" "$conf" "$PORT" "$STATE_DIR/engine.log"

log "flash sale: activity $activity, stock $STOCK, $USERS users, $RATE requests/s; pay $PAY_SHARE of the orders within $PAY_WITHIN"
"$ctl" --config "$conf" bench flash-sale --activity "$activity" --sku 1 --stock "$STOCK" \
  --users "$USERS" --rate "$RATE" --engine "http://127.0.0.1:$PORT" \
  --pay-share "$PAY_SHARE" --pay-within "$PAY_WITHIN" --plot "$PLOT"

log "seckillctl reconcile --activity $activity"
"$ctl" --config "$conf" reconcile --activity "$activity"

# The operator's view after the burst. A firing alert here (say, cancel
# lag from slow broker timers) is information, not a demo failure. The
# engine's figures need a reader token (docs/security.md); the demo issues
# one and revokes it at the end (a failed demo leaves it: `auth token
# list`). The bench issued and revoked its own.
export SECKILL_ENGINE_URL="http://127.0.0.1:$PORT"
SECKILL_TOKEN=$("$ctl" --config "$conf" auth token create --name "demo-reader-$activity" --role reader | tail -n 1)
export SECKILL_TOKEN

log "seckillctl backlog"
"$ctl" --config "$conf" backlog
log "seckillctl health"
"$ctl" --config "$conf" health || log "health exited $? (0 ok, 1 warn, 2 critical, 3 unreachable): see the alerts and runbooks above"

"$ctl" --config "$conf" auth token revoke --name "demo-reader-$activity" --reason "demo ended" >/dev/null

log "demo finished in $((SECONDS - started)) s"
