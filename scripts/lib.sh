# Shared settings for the project's scripts. Sourced, not run.
# Everything cached lives outside the clone, so a fresh clone reuses the broker
# binaries and the build outputs of earlier runs.

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE_DIR="${SECKILL_CACHE_DIR:-$HOME/.cache/seckillctl}"
STATE_DIR="${SECKILL_STATE_DIR:-$CACHE_DIR/stack}"
ROCKETMQ_VERSION="1.0.0"
ROCKETMQ_ROOT="$CACHE_DIR/rocketmq-$ROCKETMQ_VERSION"
NAMESRV_BIN="$ROCKETMQ_ROOT/bin/rocketmq-namesrv-rust"
BROKER_BIN="$ROCKETMQ_ROOT/bin/rocketmq-broker-rust"
export CARGO_TARGET_DIR="${CARGO_TARGET_DIR:-$CACHE_DIR/target}"
# promtool, for the test that checks deploy/prometheus/seckill-rules.yml
# (tests/tests/observe.rs); `stack.sh install` unpacks it from Debian's
# prometheus package.
export SECKILL_PROMTOOL="${SECKILL_PROMTOOL:-$CACHE_DIR/prometheus/promtool}"

PG_HOST=127.0.0.1
PG_PORT=5432
REDIS_PORT=6379
NAMESRV_PORT=9876
BROKER_PORT=10911
# The cluster profile's second broker (`stack.sh up --cluster`).
BROKER_B_PORT=10921
# The cluster profile's Redis Cluster: three masters, then one replica each.
REDIS_CLUSTER_MASTERS="7001 7002 7003"
REDIS_CLUSTER_REPLICAS="7004 7005 7006"
REDIS_CLUSTER_URL="redis://127.0.0.1:7001,redis://127.0.0.1:7002,redis://127.0.0.1:7003"
export SECKILL_DATABASE_URL="${SECKILL_DATABASE_URL:-postgres://postgres@$PG_HOST:$PG_PORT/seckill}"
export SECKILL_REDIS_URL="${SECKILL_REDIS_URL:-redis://127.0.0.1:$REDIS_PORT/}"
export SECKILL_NAMESRV_ADDR="${SECKILL_NAMESRV_ADDR:-127.0.0.1:$NAMESRV_PORT}"

log() { printf '[%s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

# True when something accepts TCP connections on 127.0.0.1:$1.
port_open() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# wait_until SECONDS DESCRIPTION CMD...: poll CMD every 0.5 s.
wait_until() {
  local limit=$1 what=$2; shift 2
  local deadline=$((SECONDS + limit))
  until "$@"; do
    if ((SECONDS >= deadline)); then
      return 1
    fi
    sleep 0.5
  done
  log "$what is up"
}

need_root_for_apt() {
  [ "$(id -u)" = 0 ] || die "$1 is missing and installing it needs root (apt-get). Install it, or run as root."
}

apt_install() {
  need_root_for_apt "$*"
  if [ ! -f "$STATE_DIR/.apt-updated" ]; then
    log "apt-get update"
    apt-get update -qq >&2
    mkdir -p "$STATE_DIR" && touch "$STATE_DIR/.apt-updated"
  fi
  log "apt-get install $*"
  DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "$@" >&2
}

# promtool_install: only the promtool binary of Debian's prometheus package,
# unpacked into the cache: installing the package itself would also start a
# Prometheus server on the machine, which nothing here wants.
promtool_install() {
  if [ -x "$SECKILL_PROMTOOL" ]; then return; fi
  need_root_for_apt "prometheus (for promtool)"
  if [ ! -f "$STATE_DIR/.apt-updated" ]; then
    log "apt-get update"
    apt-get update -qq >&2
    mkdir -p "$STATE_DIR" && touch "$STATE_DIR/.apt-updated"
  fi
  local tmp
  tmp=$(mktemp -d)
  chmod a+rwx "$tmp" # apt-get download fetches as its own user, _apt
  log "fetching promtool from Debian's prometheus package into $(dirname "$SECKILL_PROMTOOL")"
  (cd "$tmp" && apt-get download -qq prometheus >&2 && dpkg-deb -x prometheus_*.deb x) \
    || { rm -rf "$tmp"; die "could not fetch Debian's prometheus package for promtool (apt-get download prometheus)"; }
  mkdir -p "$(dirname "$SECKILL_PROMTOOL")"
  mv "$tmp/x/usr/bin/promtool" "$SECKILL_PROMTOOL"
  rm -rf "$tmp"
}

# write_engine_conf FILE BATCH: the publisher and consumer batch size, 4 threads.
write_engine_conf() {
  printf '[publisher]\nbatch_max = %s\n[consumer]\nbatch_max = %s\nthreads = 4\n' "$2" "$2" >"$1"
}

# start_engine BIN CONF PORT LOG: runs `BIN engine run` in the background,
# stops it on exit, and waits until /readyz answers (which waits for the
# order consumer's queues). Sets $engine to its pid.
start_engine() {
  local bin=$1 conf=$2 port=$3 logfile=$4
  "$bin" --config "$conf" engine run --listen "127.0.0.1:$port" >"$logfile" 2>&1 &
  engine=$!
  trap 'kill -TERM $engine 2>/dev/null; wait $engine 2>/dev/null || true' EXIT
  local _
  for _ in $(seq 1 150); do
    curl -fs "http://127.0.0.1:$port/readyz" >/dev/null 2>&1 && return 0
    kill -0 "$engine" 2>/dev/null || { cat "$logfile" >&2; die "the engine exited"; }
    sleep 0.2
  done
  die "the engine on 127.0.0.1:$port was not ready after 30 s (see $logfile)"
}
