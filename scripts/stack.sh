#!/usr/bin/env bash
# The local stack on loopback: PostgreSQL, Redis, RocketMQ NameServer and Broker.
#
#   scripts/stack.sh up [--cluster]   start what is missing, wait for health, create db/topics/groups;
#                                     --cluster adds a second broker (broker-b) behind the same
#                                     NameServer and a Redis Cluster (3 masters on 7001-7003, a
#                                     replica each on 7004-7006); a node that died is restarted
#                                     and rejoins (docs/scaling.md §3)
#   scripts/stack.sh status   one row per component (with --cluster or once started: every cluster node)
#   scripts/stack.sh down [--cluster]  stop only what `up` started; --cluster: only the
#                                      cluster profile's nodes (broker-b, the Redis Cluster),
#                                      back to single-node
#   scripts/stack.sh env [--cluster]  the `export SECKILL_...=` lines for this stack
#   scripts/stack.sh install  only build the broker binaries (once; cached)
#
# A service already answering on its standard port is used as it is. What this
# script starts is recorded under $STATE_DIR/started, and only that is stopped.
set -euo pipefail
source "$(dirname "${BASH_SOURCE[0]}")/lib.sh"

STARTED="$STATE_DIR/started"
mkdir -p "$STATE_DIR" "$STARTED"

mark_started() { touch "$STARTED/$1"; }

# --- PostgreSQL --------------------------------------------------------------
pg_ready() { pg_isready -q -h "$PG_HOST" -p "$PG_PORT" 2>/dev/null; }

pg_up() {
  if pg_ready; then log "postgresql already answering on $PG_PORT"; return; fi
  if ! ls /etc/postgresql/*/main >/dev/null 2>&1; then
    apt_install postgresql postgresql-client
  fi
  local ver; ver=$(ls /etc/postgresql | sort -V | tail -n1)
  local hba="/etc/postgresql/$ver/main/pg_hba.conf"
  # A loopback-only development cluster: trust on 127.0.0.1, as on the CI machines.
  if ! grep -q 'seckillctl-loopback' "$hba"; then
    sed -i '1i host all all 127.0.0.1/32 trust # seckillctl-loopback\nhost all all ::1/128 trust # seckillctl-loopback' "$hba"
  fi
  if pg_ctlcluster --skip-systemctl-redirect "$ver" main status >/dev/null 2>&1; then
    # apt-get may have started it already, before the trust lines existed.
    pg_ctlcluster --skip-systemctl-redirect "$ver" main reload >&2
  else
    log "starting postgresql $ver"
    pg_ctlcluster --skip-systemctl-redirect "$ver" main start >&2
  fi
  echo "$ver" > "$STARTED/postgresql"
  wait_until 60 postgresql pg_ready || die "postgresql did not become ready on $PG_PORT (see /var/log/postgresql)"
}

pg_setup() {
  local exists
  exists=$(psql -h "$PG_HOST" -p "$PG_PORT" -U postgres -tAc "SELECT 1 FROM pg_database WHERE datname = 'seckill'")
  if [ "$exists" != 1 ]; then
    log "creating database seckill"
    psql -h "$PG_HOST" -p "$PG_PORT" -U postgres -qc 'CREATE DATABASE seckill' >&2
  fi
  # Every order leaves dead row versions behind (outbox claims and SENT
  # updates, inbox and reservation rewrites). Without autovacuum they pile
  # up, planner statistics never arrive, and each sale runs slower than the
  # last: seen on a machine whose server had it off (issue 3).
  if [ "$(psql -h "$PG_HOST" -p "$PG_PORT" -U postgres -tAc 'SHOW autovacuum')" = off ]; then
    log "postgresql: autovacuum is off; turning it on (ALTER SYSTEM; the order tables bloat without it)"
    psql -h "$PG_HOST" -p "$PG_PORT" -U postgres -qc 'ALTER SYSTEM SET autovacuum = on' \
      -c 'SELECT pg_reload_conf()' >/dev/null
  fi
}

# --- Redis -------------------------------------------------------------------
redis_ready() { [ "$(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" ping 2>/dev/null)" = PONG ]; }

redis_up() {
  if redis_ready; then log "redis already answering on $REDIS_PORT"; return; fi
  command -v redis-server >/dev/null || apt_install redis-server
  log "starting redis"
  mkdir -p "$STATE_DIR/redis"
  # AOF, fsynced every second: a restart keeps the sale's state
  # (docs/architecture.md §4.5); without it Redis comes back empty and every
  # live activity must be restored from PostgreSQL.
  redis-server --daemonize yes --bind 127.0.0.1 --port "$REDIS_PORT" --save "" \
    --appendonly yes --appendfsync everysec \
    --dir "$STATE_DIR/redis" --logfile "$STATE_DIR/redis/redis.log" >&2
  mark_started redis
  wait_until 30 redis redis_ready || die "redis did not answer PING on $REDIS_PORT (see $STATE_DIR/redis/redis.log)"
}

# --- Redis Cluster (the cluster profile) -------------------------------------
# Six nodes on loopback, each a process of ours recorded by pid (the
# machine's own Redis on 6379 is never touched). Node timeout 2 s: a dead
# master's replica takes over within seconds, however long ago it last
# heard from it (validity factor 0: availability first; the reservations a
# replica has are those WAIT confirmed, docs/architecture.md §4.6). Full
# coverage not required: the other masters keep serving their slots while
# one shard fails over.
redis_node_ready() { [ "$(redis-cli -h 127.0.0.1 -p "$1" ping 2>/dev/null)" = PONG ]; }

redis_node_up() {
  local port=$1 dir="$STATE_DIR/redis-cluster/$1"
  if redis_node_ready "$port"; then return; fi
  mkdir -p "$dir"
  log "starting redis cluster node $port"
  redis-server --daemonize yes --bind 127.0.0.1 --port "$port" --save "" \
    --appendonly yes --appendfsync everysec \
    --cluster-enabled yes --cluster-config-file "$dir/nodes.conf" \
    --cluster-node-timeout 2000 --cluster-require-full-coverage no \
    --cluster-replica-validity-factor 0 --repl-diskless-sync-delay 0 \
    --pidfile "$dir/redis.pid" --dir "$dir" --logfile "$dir/redis.log" >&2
  wait_until 30 "redis cluster node $port" redis_node_ready "$port" \
    || die "redis cluster node $port did not answer PING (see $dir/redis.log)"
  cp "$dir/redis.pid" "$STARTED/redis-$port"
}

redis_cluster_ok() {
  redis-cli -h 127.0.0.1 -p "${1:-7001}" cluster info 2>/dev/null | tr -d '\r' | grep -qx 'cluster_state:ok'
}

redis_cluster_up() {
  command -v redis-server >/dev/null || apt_install redis-server
  local port
  for port in $REDIS_CLUSTER_MASTERS $REDIS_CLUSTER_REPLICAS; do redis_node_up "$port"; done
  # Formed once; a node restarted later finds its peers in its nodes.conf
  # and rejoins (a former master as its successor's replica).
  local known
  known=$(redis-cli -h 127.0.0.1 -p 7001 cluster info | tr -d '\r' | sed -n 's/^cluster_known_nodes://p')
  if [ "${known:-1}" = 1 ]; then
    log "creating the redis cluster (3 masters, 1 replica each)"
    local nodes=()
    for port in $REDIS_CLUSTER_MASTERS $REDIS_CLUSTER_REPLICAS; do nodes+=("127.0.0.1:$port"); done
    redis-cli --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >"$STATE_DIR/redis-cluster/create.log" 2>&1 \
      || { cat "$STATE_DIR/redis-cluster/create.log" >&2; die "redis-cli --cluster create failed"; }
  fi
  for port in $REDIS_CLUSTER_MASTERS $REDIS_CLUSTER_REPLICAS; do
    wait_until 30 "redis cluster (seen from $port)" redis_cluster_ok "$port" \
      || die "the redis cluster is not ok as seen from $port: redis-cli -p $port cluster info"
  done
  # A replica that has not finished its first sync cannot take over: the
  # cluster is up only once every replica holds its master's data.
  local replica
  for port in $REDIS_CLUSTER_MASTERS $REDIS_CLUSTER_REPLICAS; do
    [ "$(redis-cli -h 127.0.0.1 -p "$port" role 2>/dev/null | head -n1)" = slave ] || continue
    replica=$port
    wait_until 30 "redis replica $replica in sync" redis_replica_synced "$replica" \
      || die "redis replica $replica has not synced with its master (see $STATE_DIR/redis-cluster/$replica/redis.log)"
  done
}

redis_replica_synced() {
  redis-cli -h 127.0.0.1 -p "$1" info replication 2>/dev/null | tr -d '\r' | grep -qx 'master_link_status:up'
}

redis_cluster_down() {
  local port
  # All asked at once: each takes a moment to close its AOF.
  for port in $REDIS_CLUSTER_MASTERS $REDIS_CLUSTER_REPLICAS; do
    pid_alive "$STARTED/redis-$port" && kill "$(cat "$STARTED/redis-$port")" 2>/dev/null || true
  done
  for port in $REDIS_CLUSTER_MASTERS $REDIS_CLUSTER_REPLICAS; do stop_pid "redis-$port"; done
}

# One row per cluster node: its role as the cluster sees it.
redis_cluster_status() {
  local port role v
  for port in $REDIS_CLUSTER_MASTERS $REDIS_CLUSTER_REPLICAS; do
    if redis_node_ready "$port"; then
      role=$(redis-cli -h 127.0.0.1 -p "$port" role 2>/dev/null | head -n1)
      v=$(redis-cli -h 127.0.0.1 -p "$port" info server | tr -d '\r' | sed -n 's/^redis_version://p')
      if redis_cluster_ok "$port"; then
        row "redis-$port" "127.0.0.1:$port" "${v:-?}" "healthy ($role)"
      else row "redis-$port" "127.0.0.1:$port" "${v:-?}" "cluster not ok ($role)"; rc=1; fi
    else row "redis-$port" "127.0.0.1:$port" - DOWN; rc=1; fi
  done
}

# --- RocketMQ ----------------------------------------------------------------
rocketmq_install() {
  if [ -x "$NAMESRV_BIN" ] && [ -x "$BROKER_BIN" ]; then return; fi
  command -v cc >/dev/null || apt_install build-essential
  log "building rocketmq-namesrv and rocketmq-broker $ROCKETMQ_VERSION into $ROCKETMQ_ROOT (once; 10-20 min on 2 cores)"
  CARGO_TARGET_DIR="$CACHE_DIR/rocketmq-build" cargo install --locked --root "$ROCKETMQ_ROOT" \
    "rocketmq-namesrv@$ROCKETMQ_VERSION" "rocketmq-broker@$ROCKETMQ_VERSION" >&2
  # The intermediate build is 2+ GB and never needed again.
  rm -rf "$CACHE_DIR/rocketmq-build"
}

namesrv_up() {
  if port_open "$NAMESRV_PORT"; then log "rocketmq nameserver already answering on $NAMESRV_PORT"; return; fi
  local home="$STATE_DIR/namesrv"
  mkdir -p "$home"
  log "starting rocketmq nameserver"
  ROCKETMQ_HOME="$home" nohup "$NAMESRV_BIN" --bindAddress 127.0.0.1 --listenPort "$NAMESRV_PORT" \
    --rocketmqHome "$home" >"$home/namesrv.log" 2>&1 &
  echo $! > "$STARTED/namesrv"
  wait_until 60 "rocketmq nameserver" port_open "$NAMESRV_PORT" \
    || die "nameserver did not listen on $NAMESRV_PORT (see $home/namesrv.log)"
}

# broker_up NAME PORT: a master broker of the DefaultCluster on PORT (and
# its HA port, PORT + 1), its store under $STATE_DIR/NAME. broker-a keeps
# the directory "broker" it always had.
broker_up() {
  local name=${1:-broker-a} port=${2:-$BROKER_PORT}
  local dir=broker
  [ "$name" = broker-a ] || dir=$name
  if port_open "$port"; then log "rocketmq $name already answering on $port"; return; fi
  local home="$STATE_DIR/$dir"
  mkdir -p "$home/store"
  # Timer slots of 100 ms (docs/architecture.md §8.2): with the default 1 s a
  # delayed cancel came 1 to 2.9 s after its deadline. The precision is part
  # of the timer store's on-disk format, so a store made before keeps 1 s
  # (remove $home/store, and the messages in it, to get 100 ms).
  local precision=100
  if [ -e "$home/store/timerwheel.v2" ] && [ ! -f "$home/timer-precision-ms" ]; then
    precision=1000
    log "the broker's store predates 100 ms timer slots; it keeps 1 s ones"
  fi
  echo "$precision" > "$home/timer-precision-ms"
  # Consume-queue files of 120 KB, not 6 MB: every test creates its own
  # topics, and at the default the store grew by gigabytes per test run
  # until the broker refused writes for lack of disk. Also part of the
  # store's format: a store made before keeps the default.
  local cq_size=120000
  if [ -d "$home/store/consumequeue" ] && [ ! -f "$home/cq-mapped-file-size" ]; then
    cq_size=6000000
    log "the broker's store predates 120 KB consume-queue files; it keeps 6 MB ones (remove $home/store to shrink it)"
  fi
  echo "$cq_size" > "$home/cq-mapped-file-size"
  cat > "$home/broker.toml" <<TOML
[broker]
namesrvAddr = "127.0.0.1:$NAMESRV_PORT"
# A consumer's held pull is answered when a message arrives, but a message
# the timer delivers wakes nobody: the pull waited for this check, 1 s by
# default, after every timer message (docs/architecture.md §8.2).
shortPollingTimeMills = 100
brokerIp1 = "127.0.0.1"
listenPort = $port
storePathRootDir = "$home/store"
[broker.brokerServerConfig]
bindAddress = "127.0.0.1"
[broker.brokerIdentity]
brokerName = "$name"
brokerClusterName = "DefaultCluster"
brokerId = 0
[store]
storeType = "LocalFile"
brokerRole = "ASYNC_MASTER"
storePathRootDir = "$home/store"
haListenAddress = "127.0.0.1"
haListenPort = $((port + 1))
# Timer messages (the delayed cancels, docs/architecture.md §8.2): the timer
# store indexes and delivers at most timerSourceBatchMessages and
# timerDueBatchMessages per 1 s tick, 64 each by default, and delivers
# nothing until indexing has caught up. A sale's 10,000 cancels then came
# out over ~150 s and the sweep did most of them. The batch sizes are not
# part of the store's on-disk format; timerPrecisionMs is (see above).
timerSourceBatchMessages = 4096
timerDueBatchMessages = 4096
timerPrecisionMs = $precision
mappedFileSizeConsumeQueue = $cq_size
TOML
  log "starting rocketmq $name"
  ROCKETMQ_HOME="$home" nohup "$BROKER_BIN" -c "$home/broker.toml" >"$home/broker.log" 2>&1 &
  echo $! > "$STARTED/$dir"
  wait_until 90 "rocketmq $name" port_open "$port" \
    || die "$name did not listen on $port (see $home/broker.log)"
}

# $SECKILLCTL names an already built binary (test.sh and demo.sh pass theirs):
# building `-p seckillctl` alone would resolve features differently from the
# workspace build and compile the RocketMQ client a second time.
seckillctl() {
  if [ -z "${SECKILLCTL:-}" ]; then
    cargo build -q --locked -p seckillctl --manifest-path "$ROOT/Cargo.toml" >&2
    SECKILLCTL="$CARGO_TARGET_DIR/debug/seckillctl"
  fi
  "$SECKILLCTL" "$@"
}

up() {
  pg_up
  redis_up
  rocketmq_install
  namesrv_up
  broker_up broker-a "$BROKER_PORT"
  if [ "$CLUSTER" = 1 ]; then
    broker_up broker-b "$BROKER_B_PORT"
    redis_cluster_up
  fi
  pg_setup
  pg_migrate
  mq_setup
  status
}

# The default database's schema: `mq setup` writes its audit row there
# (docs/security.md), and so does everything after it.
pg_migrate() {
  seckillctl db migrate >&2
}

# Topics with the queue counts of docs/architecture.md §3 and groups with retryMaxTimes.
# The broker registers with the nameserver a moment after it listens, so this
# waits. A broker of ours that listens but cannot register (rocketmq-rust
# 1.0.0 was seen with its outgoing queue saturated, "transport.admission.
# queue_saturated", after a large timer backlog) is restarted once.
mq_setup() {
  if seckillctl mq setup --wait 60s; then return; fi
  if [ -f "$STARTED/broker" ]; then
    log "the broker is not registered with the nameserver; restarting it once (see $STATE_DIR/broker/broker.log)"
    stop_pid broker
    broker_up broker-a "$BROKER_PORT"
    seckillctl mq setup --wait 90s && return
  fi
  die "topics and groups could not be created; see $STATE_DIR/broker/broker.log"
}

pid_alive() { [ -f "$1" ] && kill -0 "$(cat "$1")" 2>/dev/null; }

stop_pid() {
  local name=$1 file="$STARTED/$1"
  [ -f "$file" ] || return 0
  if pid_alive "$file"; then
    log "stopping $name"
    kill "$(cat "$file")" 2>/dev/null || true
    for _ in $(seq 1 40); do pid_alive "$file" || break; sleep 0.25; done
    pid_alive "$file" && kill -9 "$(cat "$file")" 2>/dev/null || true
  fi
  rm -f "$file"
}

down() {
  stop_pid broker-b
  redis_cluster_down
  if [ "$CLUSTER" = 1 ]; then
    log "stopped the cluster profile's nodes; the single-node stack runs on"
    return
  fi
  stop_pid broker
  stop_pid namesrv
  if [ -f "$STARTED/redis" ]; then
    log "stopping redis"
    redis-cli -h 127.0.0.1 -p "$REDIS_PORT" shutdown nosave >/dev/null 2>&1 || true
    rm -f "$STARTED/redis"
  fi
  if [ -f "$STARTED/postgresql" ]; then
    log "stopping postgresql"
    pg_ctlcluster --skip-systemctl-redirect "$(cat "$STARTED/postgresql")" main stop >&2 || true
    rm -f "$STARTED/postgresql"
  fi
  log "stopped what stack.sh started; services it found running were left alone"
}

row() { printf '%-18s %-22s %-10s %s\n' "$@"; }

status() {
  local rc=0 v
  row COMPONENT ENDPOINT VERSION HEALTH
  if pg_ready; then
    v=$(psql -h "$PG_HOST" -p "$PG_PORT" -U postgres -tAc 'SHOW server_version' 2>/dev/null | cut -d' ' -f1)
    row postgresql "$PG_HOST:$PG_PORT" "${v:-?}" healthy
  else row postgresql "$PG_HOST:$PG_PORT" - DOWN; rc=1; fi
  if redis_ready; then
    v=$(redis-cli -h 127.0.0.1 -p "$REDIS_PORT" info server | tr -d '\r' | sed -n 's/^redis_version://p')
    row redis "127.0.0.1:$REDIS_PORT" "${v:-?}" healthy
  else row redis "127.0.0.1:$REDIS_PORT" - DOWN; rc=1; fi
  if port_open "$NAMESRV_PORT"; then row rocketmq-namesrv "127.0.0.1:$NAMESRV_PORT" "$ROCKETMQ_VERSION" healthy
  else row rocketmq-namesrv "127.0.0.1:$NAMESRV_PORT" - DOWN; rc=1; fi
  if port_open "$BROKER_PORT"; then row rocketmq-broker-a "127.0.0.1:$BROKER_PORT" "$ROCKETMQ_VERSION" healthy
  else row rocketmq-broker-a "127.0.0.1:$BROKER_PORT" - DOWN; rc=1; fi
  # broker-b: when this stack started it, or asked for (--cluster).
  if [ "$CLUSTER" = 1 ] || [ -f "$STARTED/broker-b" ]; then
    if port_open "$BROKER_B_PORT"; then row rocketmq-broker-b "127.0.0.1:$BROKER_B_PORT" "$ROCKETMQ_VERSION" healthy
    else row rocketmq-broker-b "127.0.0.1:$BROKER_B_PORT" - DOWN; rc=1; fi
  fi
  if [ "$CLUSTER" = 1 ] || ls "$STARTED"/redis-7* >/dev/null 2>&1; then redis_cluster_status; fi
  return $rc
}

# The lines that point the CLI and the engine at this stack: `eval "$(scripts/stack.sh env)"`.
# Both brokers sit behind the one NameServer, so the cluster profile's
# brokers need no address of their own: clients find them through it.
env_lines() {
  printf 'export SECKILL_DATABASE_URL=%q\n' "$SECKILL_DATABASE_URL"
  if [ "$CLUSTER" = 1 ]; then
    # Every master is a seed; the client learns the replicas from them.
    # One replica acknowledges each reservation before it is answered
    # (docs/architecture.md §4.6).
    printf 'export SECKILL_REDIS_URL=%q\n' "$REDIS_CLUSTER_URL"
    printf 'export SECKILL_REDIS_WAIT_REPLICAS=1\n'
  else
    # A shell switched to the cluster by `env --cluster` comes back here.
    local url=$SECKILL_REDIS_URL
    case "$url" in *,*) url="redis://127.0.0.1:$REDIS_PORT/" ;; esac
    printf 'export SECKILL_REDIS_URL=%q\n' "$url"
    printf 'unset SECKILL_REDIS_WAIT_REPLICAS\n'
  fi
  printf 'export SECKILL_NAMESRV_ADDR=%q\n' "$SECKILL_NAMESRV_ADDR"
}

CLUSTER=0
cmd=${1:-}
shift || true
for arg in "$@"; do
  case "$arg" in
    --cluster) CLUSTER=1 ;;
    *) echo "unknown option $arg; usage: $0 up|down|status|env|install [--cluster]" >&2; exit 2 ;;
  esac
done
case "$cmd" in
  up) up ;;
  down) down ;;
  status) status ;;
  env) env_lines ;;
  install) promtool_install; rocketmq_install ;;
  *) echo "usage: $0 up|down|status|env|install [--cluster]" >&2; exit 2 ;;
esac
