//! One drill's sale on the private servers: its own PostgreSQL database,
//! Redis key prefix and topic prefix, the engine daemons it starts, the
//! crowd it sends, and the facts it reads afterwards.

use super::procs::{Proc, Signal, port_open};
use super::servers::World;
use anyhow::{Context, Result};
use seckill_engine::{
    ActivityId, ClientRuntime, Config, Names, NewActivity, ReconcileVerdict, RequestId,
    ReservationId, ReservationStore, ReserveBody, RocketAdmin, Role, SkuId, StatsView, TopicKind,
    activity, db, facts, reconcile, redis_conn, tokens,
};
use secrecy::{ExposeSecret, SecretString};
use serde::Serialize;
use std::collections::HashSet;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::process::Command;
use tokio::task::JoinHandle;

/// `seckillctl` pointed at one drill's servers, database and prefixes.
#[derive(Clone)]
pub struct Runner {
    conf: PathBuf,
    database_url: SecretString,
    redis_url: SecretString,
    namesrv_addr: String,
    topic_prefix: String,
    token: SecretString,
}

impl Runner {
    /// Flags, so they win over any `SECKILL_*` variable the caller has.
    fn command(&self) -> Result<Command> {
        let exe = std::env::current_exe().context("find the seckillctl binary")?;
        let mut cmd = Command::new(exe);
        cmd.arg("--config")
            .arg(&self.conf)
            .arg("--database-url")
            .arg(self.database_url.expose_secret())
            .arg("--redis-url")
            .arg(self.redis_url.expose_secret())
            .arg("--namesrv-addr")
            .arg(&self.namesrv_addr)
            .arg("--topic-prefix")
            .arg(&self.topic_prefix)
            .env(crate::settings::ENV_TOKEN, self.token.expose_secret());
        Ok(cmd)
    }

    /// `seckillctl ARGS…` reading whichever engines the registry holds
    /// live, as on-call's console does with several daemons
    /// (docs/architecture.md §14.3); its exit code and its output.
    pub async fn on_registry(&self, args: &[&str]) -> Result<(i32, String)> {
        let mut cmd = self.command()?;
        cmd.env_remove(crate::settings::ENV_ENGINE_URL);
        Stage::output(cmd, args).await
    }
}

/// The shape of a drill's sale.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct SalePlan {
    pub stock: i64,
    pub users: u64,
    /// Requests offered per second.
    pub rate: u64,
    /// How long a reservation stays valid (backlog-expiry shortens it).
    pub valid_for_ms: i64,
    pub pay_within_ms: i64,
}

impl Default for SalePlan {
    fn default() -> Self {
        Self {
            stock: 1_500,
            users: 2_000,
            rate: 1_000,
            valid_for_ms: 300_000,
            pay_within_ms: 900_000,
        }
    }
}

/// One engine daemon the drill started.
pub struct Engine {
    pub proc: Proc,
    pub url: String,
}

/// A drill's slice of the world.
pub struct Stage {
    pub cfg: Config,
    pub pool: db::PgPool,
    admin_pool: db::PgPool,
    db_name: String,
    pub store: ReservationStore,
    pub admin: RocketAdmin,
    pub names: Names,
    pub http: reqwest::Client,
    /// The drill's admin token, for the `seckillctl` runs it makes.
    token: SecretString,
    pub engines: Vec<Option<Engine>>,
    pub activity: ActivityId,
    pub sku: SkuId,
    pub plan: SalePlan,
    dir: PathBuf,
    conf: PathBuf,
    port_base: u16,
}

/// `postgres://host/db` with its database swapped.
fn with_database(url: &str, db: &str) -> String {
    let (base, query) = url
        .split_once('?')
        .map_or((url, None), |(b, q)| (b, Some(q)));
    let scheme_end = base.find("://").map_or(0, |i| i + 3);
    let root = base[scheme_end..]
        .find('/')
        .map_or(base, |i| &base[..scheme_end + i]);
    match query {
        Some(q) => format!("{root}/{db}?{q}"),
        None => format!("{root}/{db}"),
    }
}

impl Stage {
    /// A fresh database (migrated), key prefix, topic prefix (created on
    /// the private broker) and activity, and the engines' config file.
    /// `engine_toml` is the drill's engine tuning, in `seckill.toml` form.
    pub async fn prepare(
        name: &str,
        base: &Config,
        world: &World,
        rt: Arc<ClientRuntime>,
        plan: SalePlan,
        engine_toml: &str,
        port_base: u16,
    ) -> Result<Self> {
        let token = ulid::Ulid::new().to_string().to_lowercase();
        let short = &token[token.len() - 8..];
        let db_name = format!("seckill_drill_{}_{short}", name.replace('-', "_"));
        let admin_url = with_database(base.database_url.expose_secret(), "postgres");
        let admin_pool = db::PgPool::connect(&admin_url).await.with_context(|| {
            "connect to PostgreSQL's postgres database; is the stack up? (./scripts/stack.sh up)"
        })?;
        sqlx::query(&format!("CREATE DATABASE \"{db_name}\""))
            .execute(&admin_pool)
            .await
            .with_context(|| format!("create the drill's database {db_name}"))?;

        let dir = world.dir().join(name);
        std::fs::create_dir_all(&dir).with_context(|| format!("create {}", dir.display()))?;
        let conf = dir.join("engine.toml");
        let mut cfg: Config = toml::from_str(engine_toml)
            .with_context(|| format!("the {name} drill's engine settings"))?;
        cfg.database_url =
            SecretString::from(with_database(base.database_url.expose_secret(), &db_name));
        cfg.redis_url = SecretString::from(world.redis_url());
        cfg.namesrv_addr = world.namesrv_addr();
        cfg.topic_prefix = format!("DRILL_{}_", short.to_uppercase());
        cfg.redis_prefix = format!("drill-{short}");
        std::fs::write(
            &conf,
            format!("redis_prefix = \"{}\"\n{engine_toml}", cfg.redis_prefix),
        )
        .with_context(|| format!("write {}", conf.display()))?;

        let pool = db::connect_unchecked(&cfg).await?;
        db::migrate(&pool).await?;
        let store =
            ReservationStore::new(redis_conn::connect(&cfg).await?, cfg.redis_prefix.clone());
        let admin = RocketAdmin::start(rt, &cfg.namesrv_addr, cfg.admin_timeout()).await?;
        let names = Names::new(cfg.topic_prefix.clone());
        setup_topics(&admin, &names, cfg.mq.max_reconsume_times).await?;

        let activity = ActivityId(chrono::Utc::now().timestamp_millis());
        let sku = SkuId(1);
        activity::create(
            &pool,
            &store,
            &NewActivity {
                activity,
                sku,
                stock: plan.stock,
                valid_for_ms: plan.valid_for_ms,
                pay_within_ms: plan.pay_within_ms,
                force: false,
            },
        )
        .await?;
        // The drill is the operator of its private stack: one admin token
        // in its private database (dropped with it) reserves, pays and reads
        // the figures on every engine it starts (docs/security.md).
        let token = tokens::create(
            &pool,
            &format!("drill-{short}"),
            Role::Admin,
            &crate::access::bootstrap(),
        )
        .await?;
        let mut headers = reqwest::header::HeaderMap::new();
        let mut bearer = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))?;
        bearer.set_sensitive(true);
        headers.insert(reqwest::header::AUTHORIZATION, bearer);
        let http = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .pool_max_idle_per_host(256)
            .default_headers(headers)
            .build()?;
        Ok(Self {
            cfg,
            pool,
            admin_pool,
            db_name,
            store,
            admin,
            names,
            http,
            token: SecretString::from(token),
            engines: Vec::new(),
            activity,
            sku,
            plan,
            dir,
            conf,
            port_base,
        })
    }

    /// This binary, pointed at the drill's servers, database and prefixes.
    fn command(&self) -> Result<Command> {
        self.runner().command()
    }

    /// What runs `seckillctl` against this drill's servers, apart from the
    /// stage, so a task can run it while the stage restarts engines.
    pub fn runner(&self) -> Runner {
        Runner {
            conf: self.conf.clone(),
            database_url: self.cfg.database_url.clone(),
            redis_url: self.cfg.redis_url.clone(),
            namesrv_addr: self.cfg.namesrv_addr.clone(),
            topic_prefix: self.cfg.topic_prefix.clone(),
            token: self.token.clone(),
        }
    }

    /// Starts engine number `i` (again), and waits until `/readyz` answers.
    pub async fn start_engine(&mut self, i: usize) -> Result<()> {
        let listen: SocketAddr = format!("127.0.0.1:{}", self.port_base + 20 + i as u16).parse()?;
        if port_open(listen).await {
            anyhow::bail!("{listen} is taken; is another drill running?");
        }
        let mut cmd = self.command()?;
        cmd.args(["--log", "info", "engine", "run", "--listen"])
            .arg(listen.to_string());
        let log = self.dir.join(format!("engine-{i}.log"));
        let mut proc = Proc::spawn(&format!("engine {i}"), &mut cmd, &log)?;
        let url = format!("http://{listen}");
        let (http, ready) = (self.http.clone(), format!("{url}/readyz"));
        proc.wait_ready(Duration::from_secs(90), || {
            let (http, ready) = (http.clone(), ready.clone());
            async move {
                http.get(&ready)
                    .send()
                    .await
                    .is_ok_and(|r| r.status().is_success())
            }
        })
        .await?;
        let engine = Engine { proc, url };
        if self.engines.len() <= i {
            self.engines.resize_with(i + 1, || None);
        }
        self.engines[i] = Some(engine);
        Ok(())
    }

    /// kill -9 of engine `i`, by the pid recorded when it was started;
    /// its pid, for the report.
    pub async fn kill_engine(&mut self, i: usize) -> Option<u32> {
        let mut e = self.engines.get_mut(i).and_then(Option::take)?;
        e.proc.kill9().await;
        Some(e.proc.pid())
    }

    /// Stops every engine at once (SIGTERM, SIGKILL after `grace`): a
    /// bulk restart's first half. Their pids, for the report.
    pub async fn stop_engines(&mut self, grace: Duration) -> Vec<u32> {
        let mut tasks = tokio::task::JoinSet::new();
        for mut e in self.engines.iter_mut().filter_map(Option::take) {
            tasks.spawn(async move {
                e.proc.stop(grace).await;
                e.proc.pid()
            });
        }
        let mut pids = Vec::new();
        while let Some(Ok(pid)) = tasks.join_next().await {
            pids.push(pid);
        }
        pids
    }

    /// SIGTERM to engine `i`, SIGKILL after `grace`: one step of a
    /// rolling restart. Its pid and whether it exited within `grace`.
    pub async fn stop_engine(&mut self, i: usize, grace: Duration) -> Option<(u32, bool)> {
        let mut e = self.engines.get_mut(i).and_then(Option::take)?;
        let started = Instant::now();
        e.proc.stop(grace).await;
        Some((e.proc.pid(), started.elapsed() < grace))
    }

    /// The index of the running engine whose registry id is `id` (found by
    /// the pid the registry recorded).
    pub async fn engine_with_id(&self, id: &str) -> Result<Option<usize>> {
        let pid: Option<i32> =
            sqlx::query_scalar("SELECT pid FROM engine_instances WHERE engine_id = $1")
                .bind(id)
                .fetch_optional(&self.pool)
                .await?;
        Ok(pid.and_then(|pid| {
            self.engines
                .iter()
                .position(|e| e.as_ref().is_some_and(|e| e.proc.pid() as i32 == pid))
        }))
    }

    /// Sends `sig` to engine `i`.
    pub fn signal_engine(&mut self, i: usize, sig: Signal) {
        if let Some(e) = self.engines.get_mut(i).and_then(Option::as_mut) {
            e.proc.signal(sig);
        }
    }

    /// Runs `seckillctl ARGS…` against this drill's servers, as on-call
    /// would; its exit code and its output.
    pub async fn seckillctl(&self, args: &[&str]) -> Result<(i32, String)> {
        let mut cmd = self.command()?;
        // Mutations go through an engine's operator API with the drill's
        // token (docs/security.md): the first engine that runs.
        if let Some(url) = self.engine_urls().into_iter().next() {
            cmd.env(crate::settings::ENV_ENGINE_URL, url);
        }
        Self::output(cmd, args).await
    }

    async fn output(mut cmd: Command, args: &[&str]) -> Result<(i32, String)> {
        let out = cmd.args(args).output().await.context("run seckillctl")?;
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        Ok((out.status.code().unwrap_or(-1), text))
    }

    pub fn engine_urls(&self) -> Vec<String> {
        self.engines
            .iter()
            .flatten()
            .map(|e| e.url.clone())
            .collect()
    }

    /// Offers `plan.users` reservations at `plan.rate` across the engines.
    pub fn start_crowd(&self) -> Crowd {
        Crowd::start(
            self.http.clone(),
            self.engine_urls(),
            self.activity,
            self.sku,
            self.plan,
        )
    }

    /// Polls until the sale is quiet: no send pending in Redis, every
    /// accepted reservation decided in PostgreSQL (but the `dead` ones the
    /// drill expects in the DLQ), and every other live Redis reservation an
    /// order. The instant it was reached; `None` when `limit` passes first.
    pub async fn wait_quiet(
        &self,
        accepted: u64,
        dead: u64,
        limit: Duration,
    ) -> Result<Option<Instant>> {
        let started = Instant::now();
        loop {
            // A store that went away and came back (the redis-restart drill)
            // fails the first command on the old connection; the next one
            // reconnects.
            match self.quiet(accepted, dead).await {
                Ok(true) => return Ok(Some(Instant::now())),
                Ok(false) => {}
                Err(e) => tracing::warn!(error = %e, "quiet check failed; trying again"),
            }
            if started.elapsed() > limit {
                return Ok(None);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn quiet(&self, accepted: u64, dead: u64) -> Result<bool> {
        let p = facts::progress(&self.pool, &self.store, self.activity).await?;
        if p.redis_pending > 0 || p.decided as u64 + dead < accepted {
            return Ok(false);
        }
        let valid: i64 = activity::pg_stock(&self.pool, self.activity)
            .await?
            .iter()
            .map(|r| r.3)
            .sum();
        Ok(self.store.live_reservations(self.activity).await? as i64 == valid + dead as i64)
    }

    /// Messages stored in `kind`'s topic, and in the DLQ of its group.
    pub async fn stored(&self, kind: TopicKind) -> Result<(i64, i64)> {
        let count = |offsets: Vec<(String, seckill_engine::QueueOffsets)>| {
            offsets.iter().map(|(_, q)| q.max - q.min).sum::<i64>()
        };
        // A broker that just restarted answers before it has registered
        // with the NameServer again: give it the NameServer's round.
        let started = Instant::now();
        let main = loop {
            match self.admin.queue_offsets(&self.names.topic(kind)).await {
                Ok(o) => break count(o),
                Err(e) if started.elapsed() < Duration::from_secs(45) => {
                    tracing::debug!(error = %e, "broker not registered yet; retrying");
                    tokio::time::sleep(Duration::from_millis(500)).await;
                }
                Err(e) => return Err(e).context("read the drill topic's offsets"),
            }
        };
        // A DLQ topic exists only once something died: no route is 0.
        let dead = match self.admin.queue_offsets(&self.names.dlq_topic(kind)).await {
            Ok(o) => count(o),
            Err(_) => 0,
        };
        Ok((main, dead))
    }

    /// The business message ids in `kind`'s DLQ, read from the broker, and
    /// how many stored copies hold them: a message the broker dead-letters
    /// twice (its consumer killed between the send-back and the offset
    /// commit) is one dead message in two copies.
    pub async fn dead_in_dlq(&self, kind: TopicKind) -> Result<(i64, HashSet<String>)> {
        let dlq = self.names.dlq_topic(kind);
        let mut ids = HashSet::new();
        let mut copies = 0;
        let Ok(queues) = self.admin.queue_offsets(&dlq).await else {
            return Ok((0, ids)); // no DLQ topic: nothing died
        };
        for (broker, q) in queues {
            let mut offset = q.min;
            while offset < q.max {
                let pulled = self
                    .admin
                    .pull(&broker, &dlq, q.queue_id, offset, 32)
                    .await?;
                for m in &pulled.messages {
                    copies += 1;
                    ids.insert(
                        m.property(seckill_engine::PROP_MESSAGE_ID)
                            .unwrap_or(&m.broker_msg_id)
                            .to_owned(),
                    );
                }
                if pulled.next_offset <= offset {
                    break;
                }
                offset = pulled.next_offset;
            }
        }
        Ok((copies, ids))
    }

    /// The engine-side figures of every engine still running.
    pub async fn stats(&self) -> Vec<StatsView> {
        let mut out = Vec::new();
        for e in self.engines.iter().flatten() {
            if let Ok(r) = self.http.get(format!("{}/v1/stats", e.url)).send().await
                && let Ok(s) = r.json::<StatsView>().await
            {
                out.push(s);
            }
        }
        out
    }

    /// Every invariant of docs/architecture.md §12 that reconcile finds
    /// broken, with its evidence.
    pub async fn violated(&self) -> Result<Vec<String>> {
        let report = reconcile::run(&self.pool, &self.store, self.activity).await?;
        Ok(report
            .checks
            .iter()
            .filter(|c| c.verdict == ReconcileVerdict::Fail)
            .map(|c| format!("{} ({})", c.invariant, c.evidence))
            .collect())
    }

    /// Stops the engines and drops the database; the topics go with the
    /// private broker's store.
    pub async fn finish(mut self) {
        for e in self.engines.iter_mut().flatten() {
            e.proc.stop(Duration::from_secs(10)).await;
        }
        self.admin.shutdown().await;
        self.pool.close().await;
        let _ = sqlx::query(&format!(
            "DROP DATABASE IF EXISTS \"{}\" WITH (FORCE)",
            self.db_name
        ))
        .execute(&self.admin_pool)
        .await;
    }
}

/// Creates the drill's topics and groups, waiting for a freshly started
/// broker to register with the NameServer.
async fn setup_topics(admin: &RocketAdmin, names: &Names, retries: i32) -> Result<()> {
    let deadline = Instant::now() + Duration::from_secs(90);
    loop {
        match seckill_engine::setup_mq(admin, names, retries).await {
            Ok(_) => return Ok(()),
            Err(_) if Instant::now() < deadline => tokio::time::sleep(Duration::from_secs(1)).await,
            Err(e) => return Err(e).context("create the drill's topics on its broker"),
        }
    }
}

/// What the crowd's requests came to.
#[derive(Debug, Default)]
pub struct CrowdTally {
    pub sent: AtomicU64,
    pub accepted: AtomicU64,
    pub refused: AtomicU64,
    /// No answer at all, after the client's own retries.
    pub failed: AtomicU64,
    reservations: Mutex<HashSet<ReservationId>>,
}

impl CrowdTally {
    pub fn distinct(&self) -> u64 {
        self.reservations
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .len() as u64
    }
}

/// The crowd: one request per user at a fixed rate, round-robin over the
/// engines. A request that gets no answer is sent again with the same
/// `request_id` to the next engine, as a client behind a load balancer
/// would; ingress is idempotent per request id.
pub struct Crowd {
    pub tally: Arc<CrowdTally>,
    task: JoinHandle<()>,
}

impl Crowd {
    fn start(
        http: reqwest::Client,
        urls: Vec<String>,
        activity: ActivityId,
        sku: SkuId,
        plan: SalePlan,
    ) -> Self {
        let tally = Arc::new(CrowdTally::default());
        let t = tally.clone();
        let task = tokio::spawn(async move {
            let paths: Arc<Vec<String>> = Arc::new(
                urls.iter()
                    .map(|u| format!("{u}/v1/activities/{activity}/skus/{sku}/reservations"))
                    .collect(),
            );
            let interval = Duration::from_secs_f64(1.0 / plan.rate.max(1) as f64);
            let started = Instant::now();
            let sem = Arc::new(tokio::sync::Semaphore::new(256));
            let mut tasks = tokio::task::JoinSet::new();
            for i in 0..plan.users {
                tokio::time::sleep_until((started + interval.mul_f64(i as f64)).into()).await;
                let Ok(permit) = sem.clone().acquire_owned().await else {
                    break;
                };
                let (http, paths, t) = (http.clone(), paths.clone(), t.clone());
                tasks.spawn(async move {
                    let body = ReserveBody {
                        user_id: 70_000_000 + i as i64,
                        request_id: RequestId::generate().to_string(),
                    };
                    t.sent.fetch_add(1, Ordering::Relaxed);
                    offer(&http, &paths, i as usize, &body, &t).await;
                    drop(permit);
                });
                while tasks.try_join_next().is_some() {}
            }
            while tasks.join_next().await.is_some() {}
        });
        Self { tally, task }
    }

    pub fn sent(&self) -> u64 {
        self.tally.sent.load(Ordering::Relaxed)
    }

    /// Waits until `n` requests have gone out (or the crowd is done).
    pub async fn until_sent(&self, n: u64) {
        while self.sent() < n && !self.task.is_finished() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Waits for the last answer.
    pub async fn finish(self) -> Arc<CrowdTally> {
        let _ = self.task.await;
        self.tally
    }
}

async fn offer(
    http: &reqwest::Client,
    paths: &[String],
    first: usize,
    body: &ReserveBody,
    t: &CrowdTally,
) {
    for attempt in 0..6 {
        let url = &paths[(first + attempt) % paths.len()];
        match http.post(url).json(body).send().await {
            Ok(resp) if resp.status() == reqwest::StatusCode::ACCEPTED => {
                t.accepted.fetch_add(1, Ordering::Relaxed);
                if let Ok(q) = resp.json::<seckill_engine::Queued>().await {
                    t.reservations
                        .lock()
                        .unwrap_or_else(|e| e.into_inner())
                        .insert(q.reservation_id);
                }
                return;
            }
            Ok(_) => {
                t.refused.fetch_add(1, Ordering::Relaxed);
                return;
            }
            Err(_) => tokio::time::sleep(Duration::from_millis(250 << attempt.min(3))).await,
        }
    }
    t.failed.fetch_add(1, Ordering::Relaxed);
}
