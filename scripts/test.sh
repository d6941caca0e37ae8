#!/usr/bin/env bash
# The README's test command: stack up, format check, clippy, every test.
# Integration tests talk to the real PostgreSQL, Redis and RocketMQ that
# stack.sh brings up; each test makes its own database, key and topic prefix.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
cd "$ROOT"

started=$SECONDS
# The broker refuses writes once its disk is 75 % full (RocketMQ's
# diskMaxUsedSpaceRatio), and every suite then fails in odd ways. The build
# cache's incremental data is the part that grows without bound (24 GB in one
# session of many feature sets); past 70 % it goes, at the cost of a slower
# build.
disk_used() { df -P "$1" | awk 'NR == 2 { sub("%", "", $5); print $5 }'; }
mkdir -p "$CARGO_TARGET_DIR"
if [ "$(disk_used "$CARGO_TARGET_DIR")" -gt 70 ]; then
  log "the disk is $(disk_used "$CARGO_TARGET_DIR") % full; removing $CARGO_TARGET_DIR/debug/incremental"
  rm -rf "$CARGO_TARGET_DIR/debug/incremental"
fi
if [ "$(disk_used "$CARGO_TARGET_DIR")" -gt 75 ]; then
  log "warning: the disk is still $(disk_used "$CARGO_TARGET_DIR") % full: the broker refuses writes past 75 %; free space (e.g. cargo clean in $CARGO_TARGET_DIR)"
fi
# Build first, with the test profile's features, and hand the binary to
# stack.sh for `mq setup`, so nothing is compiled twice. On a fresh machine
# the broker binaries build beside it: their long single-crate phases leave
# a core free.
mkdir -p "$STATE_DIR"
"$ROOT/scripts/stack.sh" install >"$STATE_DIR/install.log" 2>&1 &
installer=$!
log "cargo test --no-run (broker binaries: $STATE_DIR/install.log)"
cargo test --workspace --locked --no-run
wait "$installer" || { tail -n 40 "$STATE_DIR/install.log" >&2; die "building the broker binaries failed"; }
# The single-node tests see one broker: a broker-b left by an earlier
# cluster run (stack.sh up --cluster) is stopped first, and comes back for
# the cluster suite at the end.
"$ROOT/scripts/stack.sh" down --cluster >/dev/null
SECKILLCTL="$CARGO_TARGET_DIR/debug/seckillctl" "$ROOT/scripts/stack.sh" up

log "cargo fmt --check"
cargo fmt --all -- --check

log "engine stays headless: no UI crates in cargo tree -p seckill-engine"
if cargo tree --locked -p seckill-engine -e normal --prefix none | grep -E '^(clap|ratatui|crossterm|comfy-table) '; then
  die "seckill-engine depends on a UI crate (above); keep UI code in cli/ and tui/"
fi

log "cargo clippy --all-targets -- -D warnings"
cargo clippy --workspace --all-targets --locked --features seckill-tests/cluster -- -D warnings

# The binary without its default `otlp` feature (docs/architecture.md
# §11.5) must still build, and refuse an endpoint rather than drop spans.
log "cargo clippy -p seckillctl --no-default-features"
cargo clippy -p seckillctl --locked --no-default-features -- -D warnings

log "cargo test"
# Two cores: the integration tests share one broker, so keep the number of
# test threads modest; every test is isolated by its own prefixes.
cargo test --workspace --locked -- --test-threads "${SECKILL_TEST_THREADS:-4}"

# The drills restart servers, so they come after the integration tests, and
# only their own private servers (docs/architecture.md §13.5). The fast
# subset here; `seckillctl drill run all` is the full set (README).
log "seckillctl drill run ci"
"$CARGO_TARGET_DIR/debug/seckillctl" drill run ci

# The cluster profile (docs/scaling.md): a second broker behind the same
# NameServer and a Redis Cluster, then the suites that need them, with this
# shell pointed at them as `stack.sh env --cluster` says; then back to
# single-node so the next run's single-node tests see one broker again.
# The Redis suites run once more on the cluster: every script and pipeline
# must stay in its slot there (docs/architecture.md §4.6).
log "cluster profile: stack.sh up --cluster, then the Redis suites on Redis Cluster and the cluster suite"
SECKILLCTL="$CARGO_TARGET_DIR/debug/seckillctl" "$ROOT/scripts/stack.sh" up --cluster >/dev/null
cluster_rc=0
# (`set -e` does not hold inside a subshell tested by `||`: hence the &&.)
(
  eval "$("$ROOT/scripts/stack.sh" env --cluster)" &&
  cargo test --workspace --locked --features seckill-tests/cluster \
    --test reservation --test redis_state --test lifecycle -- --test-threads "${SECKILL_TEST_THREADS:-4}" &&
  # One test at a time: they kill a broker and a Redis master.
  cargo test --workspace --locked --features seckill-tests/cluster --test cluster -- --test-threads 1
) || cluster_rc=$?
"$ROOT/scripts/stack.sh" down --cluster
[ "$cluster_rc" = 0 ] || die "the cluster suites failed"

log "all green in $((SECONDS - started)) s"
