//! The drill's private servers: a Redis, a RocketMQ NameServer and Broker
//! on their own loopback ports and directories, started here and stopped
//! here by the pids recorded in [`Proc`]. A drill restarts these, never the
//! stack's or the machine's (docs/architecture.md §13.5). PostgreSQL is
//! shared: each drill gets its own database on the stack's server.

use super::procs::{Proc, ProcError, port_open};
use super::proxy::{Link, Proxy};
use std::net::{Ipv4Addr, SocketAddr, SocketAddrV4};
use std::path::{Path, PathBuf};
use std::time::Duration;
use tokio::process::Command;

#[derive(Debug, thiserror::Error)]
pub enum ServerError {
    #[error(transparent)]
    Proc(#[from] ProcError),
    #[error(
        "{what}: port {port} on loopback is taken; is another drill running? (set SECKILL_DRILL_PORT_BASE to move the drill's ports)"
    )]
    PortTaken { what: &'static str, port: u16 },
    #[error("{0} is missing; build it with ./scripts/stack.sh install (or point {1} at it)")]
    MissingBinary(PathBuf, &'static str),
    #[error("cannot prepare {path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
}

/// Where the private servers listen. From one base port: Redis at base,
/// NameServer at base+1, the broker's front at base+11 (what clients and
/// the NameServer see; the proxy's when there is one), its HA port at +12.
#[derive(Debug, Clone, Copy)]
pub struct Ports {
    pub base: u16,
}

impl Ports {
    pub fn redis(self) -> u16 {
        self.base
    }
    pub fn namesrv(self) -> u16 {
        self.base + 1
    }
    pub fn broker(self) -> u16 {
        self.base + 11
    }
    fn broker_ha(self) -> u16 {
        self.base + 12
    }
}

/// The programs, from the environment or the places `stack.sh` puts them.
#[derive(Debug, Clone)]
pub struct Binaries {
    pub redis: PathBuf,
    pub namesrv: PathBuf,
    pub broker: PathBuf,
}

impl Binaries {
    pub fn from_env() -> Self {
        let cache = std::env::var_os("SECKILL_CACHE_DIR")
            .map(PathBuf::from)
            .unwrap_or_else(|| {
                PathBuf::from(std::env::var_os("HOME").unwrap_or_default())
                    .join(".cache/seckillctl")
            });
        let rocket = cache.join("rocketmq-1.0.0/bin");
        let pick = |var: &str, default: PathBuf| {
            std::env::var_os(var).map(PathBuf::from).unwrap_or(default)
        };
        Self {
            redis: pick("SECKILL_REDIS_SERVER_BIN", PathBuf::from("redis-server")),
            namesrv: pick("SECKILL_NAMESRV_BIN", rocket.join("rocketmq-namesrv-rust")),
            broker: pick("SECKILL_BROKER_BIN", rocket.join("rocketmq-broker-rust")),
        }
    }

    fn check(&self) -> Result<(), ServerError> {
        for (path, var) in [
            (&self.namesrv, "SECKILL_NAMESRV_BIN"),
            (&self.broker, "SECKILL_BROKER_BIN"),
        ] {
            if !path.exists() {
                return Err(ServerError::MissingBinary(path.clone(), var));
            }
        }
        Ok(())
    }
}

fn mkdir(path: &Path) -> Result<(), ServerError> {
    std::fs::create_dir_all(path).map_err(|source| ServerError::Io {
        path: path.to_owned(),
        source,
    })
}

fn loopback(port: u16) -> SocketAddr {
    SocketAddr::V4(SocketAddrV4::new(Ipv4Addr::LOCALHOST, port))
}

/// The broker listens on 127.0.0.2 behind the proxy on 127.0.0.1, and
/// announces the proxy's address, so every client byte passes the switch.
const BROKER_BEHIND_PROXY: Ipv4Addr = Ipv4Addr::new(127, 0, 0, 2);

/// The private servers of one drill run.
pub struct World {
    dir: PathBuf,
    ports: Ports,
    bins: Binaries,
    redis: Proc,
    namesrv: Proc,
    broker: Option<Proc>,
    proxy: Proxy,
}

impl World {
    /// Starts Redis, the NameServer, the proxy and the broker under `dir`.
    pub async fn start(dir: &Path, ports: Ports, bins: Binaries) -> Result<Self, ServerError> {
        bins.check()?;
        mkdir(dir)?;
        for (what, port) in [
            ("redis", ports.redis()),
            ("nameserver", ports.namesrv()),
            ("broker", ports.broker()),
        ] {
            if port_open(loopback(port)).await {
                return Err(ServerError::PortTaken { what, port });
            }
        }
        let redis = start_redis(dir, &bins, ports).await?;
        let namesrv = start_namesrv(dir, &bins, ports).await?;
        let proxy = Proxy::start(
            loopback(ports.broker()),
            SocketAddr::new(BROKER_BEHIND_PROXY.into(), ports.broker()),
        )
        .await
        .map_err(|source| ServerError::Io {
            path: dir.to_owned(),
            source,
        })?;
        let mut world = Self {
            dir: dir.to_owned(),
            ports,
            bins,
            redis,
            namesrv,
            broker: None,
            proxy,
        };
        world.start_broker().await?;
        Ok(world)
    }

    pub fn redis_url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.ports.redis())
    }

    pub fn namesrv_addr(&self) -> String {
        format!("127.0.0.1:{}", self.ports.namesrv())
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// Starts the broker (again) on its store, and waits until it listens.
    pub async fn start_broker(&mut self) -> Result<(), ServerError> {
        if self.broker.is_some() {
            return Ok(());
        }
        let home = self.dir.join("broker");
        let store = home.join("store");
        mkdir(&store)?;
        let conf = home.join("broker.toml");
        std::fs::write(&conf, broker_toml(self.ports, &store)).map_err(|source| {
            ServerError::Io {
                path: conf.clone(),
                source,
            }
        })?;
        let addr = SocketAddr::new(BROKER_BEHIND_PROXY.into(), self.ports.broker());
        // rocketmq-rust 1.0.0's broker now and then rolls its own start back
        // ("Service lifecycle operation failed", nothing else in its log)
        // and exits; a second start on the same store comes up.
        let mut attempt = 1;
        loop {
            let mut cmd = Command::new(&self.bins.broker);
            cmd.arg("-c").arg(&conf).env("ROCKETMQ_HOME", &home);
            let mut broker = Proc::spawn("drill broker", &mut cmd, &home.join("broker.log"))?;
            match broker
                .wait_ready(Duration::from_secs(90), || port_open(addr))
                .await
            {
                Ok(()) => {
                    self.broker = Some(broker);
                    return Ok(());
                }
                Err(ProcError::Exited { .. }) if attempt < 3 => {
                    tracing::warn!(
                        attempt,
                        "the drill broker exited while starting; starting it again"
                    );
                    attempt += 1;
                }
                Err(e) => return Err(e.into()),
            }
        }
    }

    /// Redis stopped and started again on its port: it keeps nothing on disk,
    /// so it comes back empty (the redis-restart drill).
    pub async fn restart_redis(&mut self) -> Result<(), ServerError> {
        self.redis.stop(Duration::from_secs(5)).await;
        self.redis = start_redis(&self.dir, &self.bins, self.ports).await?;
        Ok(())
    }

    /// kill -9 of the broker (the broker-restart drill). Its store stays on disk.
    pub async fn kill_broker(&mut self) {
        if let Some(mut b) = self.broker.take() {
            b.kill9().await;
        }
    }

    pub fn set_link(&self, link: Link) {
        self.proxy.set(link);
    }

    /// Stops everything this world started, newest first.
    pub async fn stop(mut self) {
        if let Some(mut b) = self.broker.take() {
            b.stop(Duration::from_secs(5)).await;
        }
        self.namesrv.stop(Duration::from_secs(5)).await;
        self.redis.stop(Duration::from_secs(5)).await;
    }
}

async fn start_redis(dir: &Path, bins: &Binaries, ports: Ports) -> Result<Proc, ServerError> {
    let home = dir.join("redis");
    mkdir(&home)?;
    let mut cmd = Command::new(&bins.redis);
    cmd.args(["--bind", "127.0.0.1", "--port"])
        .arg(ports.redis().to_string())
        .args(["--save", "", "--appendonly", "no", "--dir"])
        .arg(&home);
    let mut p = Proc::spawn("drill redis", &mut cmd, &home.join("redis.log"))?;
    let addr = loopback(ports.redis());
    p.wait_ready(Duration::from_secs(20), || port_open(addr))
        .await?;
    Ok(p)
}

async fn start_namesrv(dir: &Path, bins: &Binaries, ports: Ports) -> Result<Proc, ServerError> {
    let home = dir.join("namesrv");
    mkdir(&home)?;
    let mut cmd = Command::new(&bins.namesrv);
    cmd.args(["--bindAddress", "127.0.0.1", "--listenPort"])
        .arg(ports.namesrv().to_string())
        .arg("--rocketmqHome")
        .arg(&home)
        .env("ROCKETMQ_HOME", &home);
    let mut p = Proc::spawn("drill nameserver", &mut cmd, &home.join("namesrv.log"))?;
    let addr = loopback(ports.namesrv());
    p.wait_ready(Duration::from_secs(60), || port_open(addr))
        .await?;
    Ok(p)
}

/// The stack's broker settings (scripts/stack.sh), on the drill's ports:
/// it binds 127.0.0.2 and announces 127.0.0.1, where the proxy listens.
fn broker_toml(ports: Ports, store: &Path) -> String {
    format!(
        r#"[broker]
namesrvAddr = "127.0.0.1:{namesrv}"
shortPollingTimeMills = 100
brokerIp1 = "127.0.0.1"
listenPort = {port}
storePathRootDir = "{store}"
[broker.brokerServerConfig]
bindAddress = "{bind}"
[broker.brokerIdentity]
brokerName = "drill-broker"
brokerClusterName = "DrillCluster"
brokerId = 0
[store]
storeType = "LocalFile"
brokerRole = "ASYNC_MASTER"
storePathRootDir = "{store}"
haListenAddress = "{bind}"
haListenPort = {ha}
timerSourceBatchMessages = 4096
timerDueBatchMessages = 4096
timerPrecisionMs = 100
mappedFileSizeConsumeQueue = 120000
"#,
        namesrv = ports.namesrv(),
        port = ports.broker(),
        ha = ports.broker_ha(),
        bind = BROKER_BEHIND_PROXY,
        store = store.display(),
    )
}
