#!/usr/bin/env bash
# The README's first command: bring the stack up, migrate, show health.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"

started=$SECONDS
"$ROOT/scripts/stack.sh" up

log "building seckillctl"
cargo build -q --locked -p seckillctl
ctl="$CARGO_TARGET_DIR/debug/seckillctl"

log "seckillctl db migrate"
"$ctl" db migrate

log "seckillctl health"
"$ctl" health
log "demo finished in $((SECONDS - started)) s"
