//! `seckillctl bench flash-sale`: drives the engine's HTTP ingress like a
//! flash-sale crowd, waits until the pipeline is quiet, and summarises what
//! happened. A benchmark, not a test: it reports figures, it asserts nothing.

mod plot;

use crate::output::{OutputFormat, Tabular, new_table, render};
use anyhow::{Context, Result, bail};
use rand::seq::SliceRandom;
use reqwest::StatusCode;
use seckill_engine::{
    ActivityId, ApiError, ClientRuntime, Config, Names, NewActivity, OrderId, PayBody, PayView,
    PipelineFacts, Queued, RequestId, ReservationId, ReservationStore, ReserveBody, RocketAdmin,
    Role, SkuId, StatsView, TopicKind, activity, db, facts, order, redis_conn, tokens,
};
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;
use tokio::task::{JoinHandle, JoinSet};

#[derive(Debug, clap::Subcommand)]
pub enum BenchCmd {
    /// Offer a burst of reservations at a fixed rate and report the pipeline's figures
    FlashSale(FlashSaleArgs),
}

#[derive(Debug, clap::Args)]
pub struct FlashSaleArgs {
    #[arg(long)]
    activity: ActivityId,
    #[arg(long)]
    sku: SkuId,
    #[arg(long)]
    stock: i64,
    /// Distinct users
    #[arg(long)]
    users: u64,
    /// Requests offered per second
    #[arg(long)]
    rate: u64,
    /// Share of requests sent again with the same request_id (0..1)
    #[arg(long, default_value_t = 0.0)]
    dup_requests: f64,
    /// Share of users who try again with a new request_id (0..1)
    #[arg(long, default_value_t = 0.0)]
    repeat_users: f64,
    /// The engine's HTTP address
    #[arg(long, default_value = "http://127.0.0.1:8080")]
    engine: String,
    /// Requests in flight at most
    #[arg(long, default_value_t = 512)]
    concurrency: usize,
    /// How long an order may stay unpaid; a short one lets the demo watch
    /// unpaid orders cancel and give their stock back
    #[arg(long, value_parser = crate::parse::duration, default_value = "15m")]
    pay_within: Duration,
    /// Share of created orders to pay (0..1). When given, the bench then
    /// waits until every unpaid order is canceled and every compensation
    /// is released in Redis
    #[arg(long)]
    pay_share: Option<f64>,
    /// Give up waiting for the pipeline to go quiet after this long
    #[arg(long, value_parser = crate::parse::duration, default_value = "180s")]
    quiet_timeout: Duration,
    /// Also draw the sale's timeline into this SVG: reservations/s and
    /// orders/s, the backlog in messages and seconds, end-to-end p50, p99
    /// and p99.9 (docs/architecture.md §11.7)
    #[arg(long, value_name = "FILE.svg")]
    plot: Option<PathBuf>,
    #[arg(long, short, value_enum, default_value_t)]
    output: OutputFormat,
}

#[derive(Debug, Default, Serialize, Clone)]
struct Ingress {
    offered: u64,
    accepted: u64,
    rejected: BTreeMap<String, u64>,
    errors: u64,
    distinct_reservations: u64,
}

#[derive(Debug, Serialize)]
struct Summary {
    activity_id: ActivityId,
    stock: i64,
    users: u64,
    rate_offered: u64,
    burst_seconds: f64,
    reservation_throughput: f64,
    ingress: Ingress,
    pipeline: PipelineFacts,
    send_latency_p50_ms: f64,
    send_latency_p99_ms: f64,
    publish_batches: u64,
    /// Order-create messages sent, by outcome, first sends and the
    /// scanner's re-sends alike: the engine's counters since it started,
    /// across every activity it serves (a fresh engine counts one run).
    sends: Sends,
    scanner_resent: u64,
    /// Queued in the publisher past their first retry time, so sent by the
    /// scanner only (not twice).
    handed_to_scanner: u64,
    peak_lag_messages: i64,
    peak_lag_seconds: f64,
    quiet: bool,
    quiet_after_seconds: f64,
    /// Present when `--pay-share` was given.
    lifecycle: Option<LifecycleSummary>,
}

/// Sends by outcome (docs/architecture.md §6): an UNKNOWN send is re-sent
/// by the scanner with the same message_id.
#[derive(Debug, Default, Serialize)]
struct Sends {
    confirmed: u64,
    unknown: u64,
    failed: u64,
}

/// Payment and cancellation after the orders (docs/architecture.md §8).
#[derive(Debug, Default, Serialize)]
struct LifecycleSummary {
    pay_attempted: u64,
    /// Pay answers by outcome (PAID, CANCELED, WINDOW_CLOSED, ...).
    pay_outcomes: BTreeMap<String, u64>,
    orders_paid: i64,
    orders_canceled: i64,
    orders_unpaid: i64,
    /// Cancels by the delayed message and by the sweep: the engine's
    /// counters since it started, across every activity it serves.
    canceled_by_timer_message: u64,
    canceled_by_sweep: u64,
    compensations_released: i64,
    compensations_pending: i64,
    settled: bool,
    settled_after_seconds: f64,
}

impl Tabular for Summary {
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table(["FIGURE", "VALUE"]);
        let lifecycle = self.lifecycle.as_ref().map(LifecycleSummary::rows);
        let rows = [
            self.ingress_rows(),
            self.pipeline_rows(),
            lifecycle.unwrap_or_default(),
            vec![self.quiet_row()],
        ];
        for (k, v) in rows.into_iter().flatten() {
            t.add_row([k, v]);
        }
        t
    }
}

/// One `FIGURE | VALUE` row.
type Row = (String, String);

fn row(figure: &str, value: String) -> Row {
    (figure.to_owned(), value)
}

impl Summary {
    /// What the HTTP ingress answered during the burst.
    fn ingress_rows(&self) -> Vec<Row> {
        let i = &self.ingress;
        let mut rows = vec![
            row(
                "offered",
                format!(
                    "{} requests at {}/s over {:.2} s",
                    i.offered, self.rate_offered, self.burst_seconds
                ),
            ),
            row(
                "accepted (202 QUEUED)",
                format!(
                    "{} ({} distinct reservations)",
                    i.accepted, i.distinct_reservations
                ),
            ),
        ];
        rows.extend(
            i.rejected
                .iter()
                .map(|(k, v)| row(&format!("rejected at ingress: {k}"), v.to_string())),
        );
        rows.push(row("ingress errors", i.errors.to_string()));
        rows.push(row(
            "reservation throughput",
            format!("{:.0}/s", self.reservation_throughput),
        ));
        rows
    }

    /// Outcomes in PostgreSQL and how the pipeline behind the ingress kept up.
    fn pipeline_rows(&self) -> Vec<Row> {
        let p = &self.pipeline;
        let e = &p.end_to_end;
        let mut rows: Vec<Row> = p
            .outcomes
            .iter()
            .map(|(k, v)| row(&format!("outcome: {k}"), v.to_string()))
            .collect();
        rows.extend([
            row(
                "send latency p50 / p99",
                format!(
                    "{:.1} / {:.1} ms ({} batches)",
                    self.send_latency_p50_ms, self.send_latency_p99_ms, self.publish_batches
                ),
            ),
            row(
                "order-consume rate",
                format!("{:.0} orders/s", p.consume_rate),
            ),
            row(
                "end to end p50 / p99 / p99.9",
                format!(
                    "{:.0} / {:.0} / {:.0} ms (n={})",
                    e.p50_ms, e.p99_ms, e.p999_ms, e.count
                ),
            ),
            row(
                "peak lag",
                format!(
                    "{} messages, {:.1} s",
                    self.peak_lag_messages, self.peak_lag_seconds
                ),
            ),
            row(
                "sends (engine)",
                format!(
                    "{} confirmed, {} unknown, {} failed",
                    self.sends.confirmed, self.sends.unknown, self.sends.failed
                ),
            ),
            row(
                "scanner re-sends",
                format!(
                    "{} ({} handed over unsent by the publisher)",
                    self.scanner_resent, self.handed_to_scanner
                ),
            ),
            row("quarantined (all activities)", p.quarantined.to_string()),
        ]);
        rows
    }

    fn quiet_row(&self) -> Row {
        row(
            "quiet",
            format!(
                "{} after {:.1} s (pending {}, live {})",
                self.quiet,
                self.quiet_after_seconds,
                self.pipeline.redis_pending,
                self.pipeline.redis_live_reservations
            ),
        )
    }
}

impl LifecycleSummary {
    fn rows(&self) -> Vec<Row> {
        let outcomes: Vec<String> = self
            .pay_outcomes
            .iter()
            .map(|(k, v)| format!("{k} {v}"))
            .collect();
        vec![
            row(
                "pay attempts",
                format!("{} ({})", self.pay_attempted, outcomes.join(", ")),
            ),
            row(
                "orders paid / canceled / still unpaid",
                format!(
                    "{} / {} / {}",
                    self.orders_paid, self.orders_canceled, self.orders_unpaid
                ),
            ),
            row(
                "canceled by timer message / by sweep (engine-wide)",
                format!(
                    "{} / {}",
                    self.canceled_by_timer_message, self.canceled_by_sweep
                ),
            ),
            row(
                "compensations released / pending",
                format!(
                    "{} / {}",
                    self.compensations_released, self.compensations_pending
                ),
            ),
            row(
                "lifecycle settled",
                format!("{} after {:.1} s", self.settled, self.settled_after_seconds),
            ),
        ]
    }
}

// ---------------------------------------------------------------------------
// The run, phase by phase: setup, burst, wait for quiet, pay and cancel,
// summary.
// ---------------------------------------------------------------------------

pub async fn run(cmd: BenchCmd, cfg: &Config, rt: Arc<ClientRuntime>) -> Result<()> {
    let BenchCmd::FlashSale(args) = cmd;
    check_args(&args)?;
    crate::access::writable(cfg, "bench flash-sale")?;
    let env = Env::connect(&args, cfg).await?;
    let result = flash_sale(args, cfg, rt, &env).await;
    // The run's tokens end with it, whatever happened (docs/security.md).
    env.tokens.revoke(&env.pool).await;
    result
}

async fn flash_sale(
    args: FlashSaleArgs,
    cfg: &Config,
    rt: Arc<ClientRuntime>,
    env: &Env,
) -> Result<()> {
    create_activity(&args, env).await?;
    let reqs = plan(&args);
    // The plot's origin: the lag samples count from here, PostgreSQL's
    // seconds too.
    let began = chrono::Utc::now();
    let lag = LagSampler::start(cfg, rt, (env.read_http.clone(), args.engine.clone())).await?;

    let mut progress = Progress::new();
    let burst = burst(&args, &env.http, reqs, &mut progress).await?;
    eprintln!(
        "[bench] burst done in {:.2} s; waiting for the pipeline to go quiet",
        burst.seconds
    );
    let quiet = wait_for_quiet(
        &args,
        env,
        burst.ingress.distinct_reservations,
        &mut progress,
    )
    .await?;
    let pipeline = facts::collect(&env.pool, &env.store, args.activity).await?;
    let (peak_lag, backlog) = lag.stop().await;
    // The sale is over: end it, so the sweeps retire it from Redis once its
    // orders are decided and the next sale's cost does not carry this one
    // (docs/architecture.md §16.3).
    activity::end(&env.pool, args.activity, Duration::ZERO).await?;

    let lifecycle = match args.pay_share {
        Some(share) => Some(pay_and_settle(&args, &env.pool, &env.pay_http, share).await?),
        None => None,
    };
    if let Some(path) = &args.plot {
        let seconds = facts::timeline(&env.pool, args.activity, began).await?;
        plot::draw(&plot::Timeline { seconds, backlog }, path)?;
        eprintln!("[bench] the sale's timeline: {}", path.display());
    }
    let stats = engine_stats(&env.read_http, &args.engine).await?;
    let summary = summarise(
        &args,
        burst,
        Drained {
            pipeline,
            peak_lag,
            quiet,
        },
        &stats,
        lifecycle,
    );
    render(&mut std::io::stdout().lock(), args.output, &summary)
}

fn check_args(args: &FlashSaleArgs) -> Result<()> {
    // Refused before the sale, not after it: a run is minutes long.
    if let Some(path) = &args.plot {
        let dir = match path.parent() {
            Some(d) if !d.as_os_str().is_empty() => d,
            _ => std::path::Path::new("."),
        };
        if !dir.is_dir() {
            bail!(
                "--plot {}: the directory {} does not exist; create it or name another file",
                path.display(),
                dir.display()
            );
        }
    }
    if args.rate == 0 || args.users == 0 || args.concurrency == 0 {
        bail!("--rate, --users and --concurrency must be positive");
    }
    if !(0.0..=1.0).contains(&args.dup_requests)
        || !(0.0..=1.0).contains(&args.repeat_users)
        || !(0.0..=1.0).contains(&args.pay_share.unwrap_or(0.0))
    {
        bail!("--dup-requests, --repeat-users and --pay-share are shares between 0 and 1");
    }
    if args.pay_within.is_zero() {
        bail!("--pay-within must be positive");
    }
    Ok(())
}

/// Locks a tally; a task that panicked holding it leaves counts worth
/// reporting, not a reason to lose them all.
fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Throttles the `[bench]` progress lines on stderr. One clock runs across
/// the burst and the wait after it, so the first wait line follows the last
/// burst line by a second.
struct Progress(Instant);

impl Progress {
    fn new() -> Self {
        Self(Instant::now())
    }

    /// True at most once per `every`.
    fn due(&mut self, every: Duration) -> bool {
        let due = self.0.elapsed() >= every;
        if due {
            self.0 = Instant::now();
        }
        due
    }
}

// ---- Setup ----

/// PostgreSQL and Redis seed the activity and give the facts; HTTP drives
/// the engine, each kind of call with a token of the least role it needs.
struct Env {
    pool: db::PgPool,
    store: ReservationStore,
    /// Reservations (role ingress).
    http: reqwest::Client,
    /// Payments (role payments): the payment provider's callback.
    pay_http: reqwest::Client,
    /// `/v1/stats` (role reader).
    read_http: reqwest::Client,
    tokens: RunTokens,
}

/// The tokens a bench run issues itself over the database URL, and revokes
/// when it ends.
struct RunTokens(Vec<String>);

impl RunTokens {
    async fn issue(pool: &db::PgPool, role: Role, names: &mut Vec<String>) -> Result<String> {
        let name = format!(
            "bench-{role}-{}",
            ulid::Ulid::new().to_string().to_lowercase()
        );
        let secret = tokens::create(pool, &name, role, &crate::access::bootstrap()).await?;
        names.push(name);
        Ok(secret)
    }

    async fn revoke(&self, pool: &db::PgPool) {
        let actor = crate::access::bootstrap();
        for name in &self.0 {
            if let Err(e) = tokens::revoke(pool, name, &actor, Some("bench run ended")).await {
                eprintln!("[bench] could not revoke token {name}: {e}");
            }
        }
    }
}

fn client_with(token: &str, idle: usize) -> Result<reqwest::Client> {
    let mut headers = reqwest::header::HeaderMap::new();
    let mut v = reqwest::header::HeaderValue::from_str(&format!("Bearer {token}"))?;
    v.set_sensitive(true);
    headers.insert(reqwest::header::AUTHORIZATION, v);
    Ok(reqwest::Client::builder()
        .pool_max_idle_per_host(idle)
        .timeout(Duration::from_secs(10))
        .default_headers(headers)
        .build()?)
}

impl Env {
    /// Connects, issues the run's tokens, and refuses to start against an
    /// engine that is not ready.
    async fn connect(args: &FlashSaleArgs, cfg: &Config) -> Result<Self> {
        let pool = db::connect(cfg).await?;
        let store =
            ReservationStore::new(redis_conn::connect(cfg).await?, cfg.redis_prefix.clone());
        let mut names = Vec::new();
        let ingress = RunTokens::issue(&pool, Role::Ingress, &mut names).await;
        let payments = RunTokens::issue(&pool, Role::Payments, &mut names).await;
        let reader = RunTokens::issue(&pool, Role::Reader, &mut names).await;
        let tokens = RunTokens(names);
        let (ingress, payments, reader) = match (ingress, payments, reader) {
            (Ok(i), Ok(p), Ok(r)) => (i, p, r),
            (i, p, r) => {
                tokens.revoke(&pool).await;
                return Err(i.and(p).and(r).unwrap_err());
            }
        };
        let http = client_with(&ingress, args.concurrency)?;
        let pay_http = client_with(&payments, args.concurrency)?;
        let read_http = client_with(&reader, 4)?;
        let ready = http
            .get(format!("{}/readyz", args.engine))
            .send()
            .await
            .and_then(|r| r.error_for_status());
        if let Err(e) = ready {
            tokens.revoke(&pool).await;
            return Err(anyhow::Error::new(e).context(format!(
                "the engine at {} is not ready; start it with `seckillctl engine run`",
                args.engine
            )));
        }
        Ok(Self {
            pool,
            store,
            http,
            pay_http,
            read_http,
            tokens,
        })
    }
}

async fn create_activity(args: &FlashSaleArgs, env: &Env) -> Result<()> {
    activity::create(
        &env.pool,
        &env.store,
        &NewActivity {
            activity: args.activity,
            sku: args.sku,
            stock: args.stock,
            valid_for_ms: 300_000,
            pay_within_ms: args.pay_within.as_millis() as i64,
            // A bench run needs a fresh activity: earlier results would be counted.
            force: false,
        },
    )
    .await?;
    Ok(())
}

/// The request bodies of the burst, shuffled: one per user, plus the
/// `--dup-requests` share sent again with the same `request_id` and the
/// `--repeat-users` share trying again with a new one.
fn plan(args: &FlashSaleArgs) -> Vec<ReserveBody> {
    let mut rng = rand::rng();
    // Users fit an i64: the plan holds one body per user in memory.
    let base = 90_000_000i64;
    let mut reqs: Vec<ReserveBody> = (0..args.users)
        .map(|i| ReserveBody {
            user_id: base + i as i64,
            request_id: RequestId::generate().to_string(),
        })
        .collect();
    let mut extra = Vec::new();
    for r in &reqs {
        if rand::random::<f64>() < args.dup_requests {
            extra.push(r.clone());
        }
        if rand::random::<f64>() < args.repeat_users {
            extra.push(ReserveBody {
                user_id: r.user_id,
                request_id: RequestId::generate().to_string(),
            });
        }
    }
    reqs.extend(extra);
    reqs.shuffle(&mut rng);
    reqs
}

/// Polls the order group's lag every 250 ms from setup until the pipeline
/// is quiet, keeping every sample: the summary takes the peaks, the plot
/// the whole line. Each queue counts from the further of the broker's
/// committed offset and the engine's own consumer position, as `health`
/// does (docs/architecture.md §10.4): the broker's offsets trail the
/// consumer by up to a second, which read as a backlog that was gone.
struct LagSampler {
    /// (seconds since the start, messages, seconds).
    samples: Arc<Mutex<Vec<(f64, i64, f64)>>>,
    running: Arc<AtomicBool>,
    task: JoinHandle<()>,
}

impl LagSampler {
    async fn start(
        cfg: &Config,
        rt: Arc<ClientRuntime>,
        engine: (reqwest::Client, String),
    ) -> Result<Self> {
        let began = Instant::now();
        let names = Names::new(cfg.topic_prefix.clone());
        let admin = RocketAdmin::start(rt, &cfg.namesrv_addr, cfg.admin_timeout()).await?;
        let (topic, group) = (
            names.topic(TopicKind::OrderCreate),
            names.group(TopicKind::OrderCreate),
        );
        let samples = Arc::new(Mutex::new(Vec::new()));
        let running = Arc::new(AtomicBool::new(true));
        let (seen, run) = (samples.clone(), running.clone());
        let task = tokio::spawn(async move {
            let (http, url) = engine;
            let sample = || async {
                // The engine first: a position read before the broker can
                // only be behind what the broker then says.
                let positions = engine_stats(&http, &url)
                    .await
                    .map(|s| s.positions_of(&group, &topic))
                    .unwrap_or_default();
                if let Ok(l) = admin
                    .lag_detail_with(&topic, &group, 1, usize::MAX, &positions)
                    .await
                {
                    let at = began.elapsed().as_secs_f64();
                    lock(&seen).push((at, l.messages, l.seconds));
                }
            };
            while run.load(Ordering::Relaxed) {
                sample().await;
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            // One more once the pipeline is quiet, so the line ends where
            // the sale did.
            sample().await;
            admin.shutdown().await;
        });
        Ok(Self {
            samples,
            running,
            task,
        })
    }

    /// Stops polling (and the admin client); gives the peak lag, in
    /// messages and in seconds (each its own maximum), and every sample.
    async fn stop(self) -> ((i64, f64), Vec<(f64, i64, f64)>) {
        self.running.store(false, Ordering::Relaxed);
        let _ = self.task.await;
        let samples = std::mem::take(&mut *lock(&self.samples));
        let peak = samples
            .iter()
            .fold((0, 0.0), |(m, s), &(_, lm, ls)| (lm.max(m), ls.max(s)));
        (peak, samples)
    }
}

// ---- Burst ----

/// What one reservation request came to, as the ingress figures count it.
#[derive(Debug, PartialEq)]
enum Answer {
    /// 202 QUEUED; the reservation, when the body names one.
    Accepted(Option<ReservationId>),
    /// Any other status: the body's error code, or the status itself.
    Rejected(String),
    /// No HTTP answer at all (connection refused, timeout).
    Failed,
}

/// Reads an answer to a reservation request. An unreadable body is counted,
/// never fatal: a 202 without a `Queued` body is still accepted, and a
/// refusal without an `ApiError` body is counted under its status.
fn answer(status: StatusCode, body: &[u8]) -> Answer {
    if status == StatusCode::ACCEPTED {
        let queued: Option<Queued> = serde_json::from_slice(body).ok();
        Answer::Accepted(queued.map(|q| q.reservation_id))
    } else {
        Answer::Rejected(error_code(body).unwrap_or_else(|| status.to_string()))
    }
}

/// The stable code of an error body (`SOLD_OUT`, `ADMISSION_CLOSED`, ...).
fn error_code(body: &[u8]) -> Option<String> {
    serde_json::from_slice::<ApiError>(body)
        .ok()
        .map(|e| e.error)
}

async fn reserve(http: &reqwest::Client, url: &str, body: &ReserveBody) -> Answer {
    match http.post(url).json(body).send().await {
        Ok(resp) => {
            let status = resp.status();
            // A body cut short reads as empty: counted like any unreadable one.
            let bytes = resp.bytes().await.unwrap_or_default();
            answer(status, &bytes)
        }
        Err(_) => Answer::Failed,
    }
}

/// The ingress figures as the answers come in.
#[derive(Debug, Default)]
struct Tally {
    ingress: Ingress,
    reservations: HashSet<ReservationId>,
}

impl Tally {
    fn count(&mut self, a: Answer) {
        let g = &mut self.ingress;
        g.offered += 1;
        match a {
            Answer::Accepted(id) => {
                g.accepted += 1;
                if let Some(id) = id {
                    self.reservations.insert(id);
                }
            }
            Answer::Rejected(code) => *g.rejected.entry(code).or_default() += 1,
            Answer::Failed => g.errors += 1,
        }
    }

    fn into_ingress(self) -> Ingress {
        Ingress {
            distinct_reservations: self.reservations.len() as u64,
            ..self.ingress
        }
    }
}

struct Burst {
    ingress: Ingress,
    seconds: f64,
}

/// Offers every request at `--rate`, at most `--concurrency` in flight,
/// and waits for the last answer.
async fn burst(
    args: &FlashSaleArgs,
    http: &reqwest::Client,
    reqs: Vec<ReserveBody>,
    progress: &mut Progress,
) -> Result<Burst> {
    let tally = Arc::new(Mutex::new(Tally::default()));
    let sem = Arc::new(Semaphore::new(args.concurrency));
    let started = Instant::now();
    let interval = Duration::from_secs_f64(1.0 / args.rate as f64);
    let url = format!(
        "{}/v1/activities/{}/skus/{}/reservations",
        args.engine, args.activity, args.sku
    );
    let total = reqs.len();
    let mut tasks = JoinSet::new();
    for (i, body) in reqs.into_iter().enumerate() {
        tokio::time::sleep_until((started + interval.mul_f64(i as f64)).into()).await;
        let permit = sem.clone().acquire_owned().await?;
        let (http, url, shared) = (http.clone(), url.clone(), tally.clone());
        tasks.spawn(async move {
            let a = reserve(&http, &url, &body).await;
            lock(&shared).count(a);
            drop(permit);
        });
        while tasks.try_join_next().is_some() {}
        if progress.due(Duration::from_secs(1)) {
            let g = lock(&tally).ingress.clone();
            eprintln!(
                "[bench] sent {}/{total}, accepted {}, rejected {}, errors {}",
                i + 1,
                g.accepted,
                g.rejected.values().sum::<u64>(),
                g.errors
            );
        }
    }
    while tasks.join_next().await.is_some() {}
    let seconds = started.elapsed().as_secs_f64();
    let ingress = std::mem::take(&mut *lock(&tally)).into_ingress();
    Ok(Burst { ingress, seconds })
}

// ---- Wait for quiet ----

struct Quiet {
    /// Every accepted reservation decided and no send pending.
    reached: bool,
    after_seconds: f64,
}

/// Waits until every distinct reservation is decided in PostgreSQL and no
/// send is pending in Redis, or `--quiet-timeout` passes.
async fn wait_for_quiet(
    args: &FlashSaleArgs,
    env: &Env,
    reservations: u64,
    progress: &mut Progress,
) -> Result<Quiet> {
    // Poll the cheap progress counters, not the full facts: reading every
    // decision's latency ten times a second would slow the consumer being
    // measured.
    let started = Instant::now();
    let reached = loop {
        let p = facts::progress(&env.pool, &env.store, args.activity).await?;
        if p.decided as u64 >= reservations && p.redis_pending == 0 {
            break true;
        }
        if started.elapsed() > args.quiet_timeout {
            break false;
        }
        if progress.due(Duration::from_secs(1)) {
            eprintln!(
                "[bench] decided {}/{reservations}, pending sends {}",
                p.decided, p.redis_pending
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    Ok(Quiet {
        reached,
        after_seconds: started.elapsed().as_secs_f64(),
    })
}

// ---- Pay and cancel (docs/architecture.md §8) ----

/// Pays `share` of the activity's created orders through the engine's pay
/// endpoint, then waits until no order is left unpaid (the delayed cancels
/// ran) and every compensation is settled in Redis.
async fn pay_and_settle(
    args: &FlashSaleArgs,
    pool: &db::PgPool,
    http: &reqwest::Client,
    share: f64,
) -> Result<LifecycleSummary> {
    let mut orders = order::unpaid_ids(pool, args.activity).await?;
    orders.shuffle(&mut rand::rng());
    orders.truncate((orders.len() as f64 * share).round() as usize);
    eprintln!("[bench] paying {} orders", orders.len());
    let summary = LifecycleSummary {
        pay_attempted: orders.len() as u64,
        pay_outcomes: pay_all(args, http, orders).await,
        ..LifecycleSummary::default()
    };
    eprintln!(
        "[bench] waiting for unpaid orders to cancel (pay window {} s) and compensations to settle",
        args.pay_within.as_secs()
    );
    settle(args, pool, summary).await
}

/// Pays every order, at most 64 at once; answers by outcome.
async fn pay_all(
    args: &FlashSaleArgs,
    http: &reqwest::Client,
    orders: Vec<OrderId>,
) -> BTreeMap<String, u64> {
    let sem = Arc::new(Semaphore::new(args.concurrency.min(64)));
    let mut tasks = JoinSet::new();
    for id in orders {
        let (http, sem) = (http.clone(), sem.clone());
        let url = format!("{}/v1/orders/{id}/pay", args.engine);
        tasks.spawn(async move {
            let _permit = sem.acquire_owned().await;
            pay(&http, &url).await
        });
    }
    let mut outcomes = BTreeMap::new();
    while let Some(done) = tasks.join_next().await {
        let outcome = done.unwrap_or_else(|e| format!("ERROR: {e}"));
        *outcomes.entry(outcome).or_default() += 1;
    }
    outcomes
}

async fn pay(http: &reqwest::Client, url: &str) -> String {
    match http.post(url).json(&PayBody::default()).send().await {
        Ok(r) => {
            let status = r.status();
            let body = r.bytes().await.unwrap_or_default();
            pay_outcome(status, &body)
        }
        Err(e) => format!("ERROR: {e}"),
    }
}

/// The pay answer's outcome (`PAID`, `ALREADY_PAID`), else its error code
/// (`CANCELED`, `WINDOW_CLOSED`), else the status.
fn pay_outcome(status: StatusCode, body: &[u8]) -> String {
    serde_json::from_slice::<PayView>(body)
        .ok()
        .map(|v| v.outcome)
        .or_else(|| error_code(body))
        .unwrap_or_else(|| status.to_string())
}

/// Polls the lifecycle facts until nothing is left to cancel or give back,
/// or the pay window plus `--quiet-timeout` passes.
async fn settle(
    args: &FlashSaleArgs,
    pool: &db::PgPool,
    mut summary: LifecycleSummary,
) -> Result<LifecycleSummary> {
    let started = Instant::now();
    let limit = args.pay_within + args.quiet_timeout;
    let mut progress = Progress::new();
    loop {
        let f = facts::lifecycle(pool, args.activity).await?;
        summary.orders_paid = f.paid;
        summary.orders_canceled = f.canceled;
        summary.orders_unpaid = f.unpaid;
        summary.compensations_released = f.compensations_settled;
        summary.compensations_pending = f.compensations_pending;
        summary.settled = f.settled();
        summary.settled_after_seconds = started.elapsed().as_secs_f64();
        if summary.settled || started.elapsed() > limit {
            return Ok(summary);
        }
        if progress.due(Duration::from_secs(2)) {
            eprintln!(
                "[bench] paid {}, canceled {}, unpaid {}, compensations pending {}",
                f.paid, f.canceled, f.unpaid, f.compensations_pending
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

// ---- Summary ----

async fn engine_stats(http: &reqwest::Client, engine: &str) -> Result<StatsView> {
    http.get(format!("{engine}/v1/stats"))
        .send()
        .await?
        .json()
        .await
        .context("read the engine's /v1/stats")
}

/// The pipeline once the burst drained.
struct Drained {
    pipeline: PipelineFacts,
    /// (messages, seconds).
    peak_lag: (i64, f64),
    quiet: Quiet,
}

fn summarise(
    args: &FlashSaleArgs,
    burst: Burst,
    drained: Drained,
    stats: &StatsView,
    mut lifecycle: Option<LifecycleSummary>,
) -> Summary {
    if let Some(l) = lifecycle.as_mut() {
        l.canceled_by_timer_message = stats.lifecycle.canceled;
        l.canceled_by_sweep = stats.lifecycle.sweep_canceled;
    }
    let Drained {
        pipeline,
        peak_lag: (peak_lag_messages, peak_lag_seconds),
        quiet,
    } = drained;
    Summary {
        activity_id: args.activity,
        stock: args.stock,
        users: args.users,
        rate_offered: args.rate,
        burst_seconds: burst.seconds,
        reservation_throughput: burst.ingress.accepted as f64 / burst.seconds.max(1e-9),
        ingress: burst.ingress,
        pipeline,
        send_latency_p50_ms: stats.send_latency.p50_ms,
        send_latency_p99_ms: stats.send_latency.p99_ms,
        publish_batches: stats.publish_batches,
        sends: Sends {
            confirmed: stats.publish_confirmed,
            unknown: stats.publish_unknown,
            failed: stats.publish_definite_failure,
        },
        scanner_resent: stats.scanner_resent,
        handed_to_scanner: stats.publish_handed_to_scanner,
        peak_lag_messages,
        peak_lag_seconds,
        quiet: quiet.reached,
        quiet_after_seconds: quiet.after_seconds,
        lifecycle,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use seckill_engine::{MessageId, Percentiles};

    /// A summary touching every row: rejections, outcomes and the
    /// lifecycle part.
    fn fixture() -> Summary {
        let count = |kv: &[(&str, u64)]| -> BTreeMap<String, u64> {
            kv.iter().map(|(k, v)| ((*k).to_owned(), *v)).collect()
        };
        Summary {
            activity_id: ActivityId(7),
            stock: 100,
            users: 1000,
            rate_offered: 500,
            burst_seconds: 2.004,
            reservation_throughput: 49.9,
            ingress: Ingress {
                offered: 1100,
                accepted: 100,
                rejected: count(&[("SOLD_OUT", 990), ("503 Service Unavailable", 4)]),
                errors: 6,
                distinct_reservations: 98,
            },
            pipeline: PipelineFacts {
                outcomes: [
                    ("ORDER_CREATED".to_owned(), 97),
                    ("REJECTED_EXPIRED".to_owned(), 1),
                ]
                .into_iter()
                .collect(),
                decided: 98,
                end_to_end: Percentiles {
                    count: 98,
                    p50_ms: 12.4,
                    p95_ms: 40.0,
                    p99_ms: 88.6,
                    p999_ms: 90.2,
                    max_ms: 91.0,
                },
                consume_rate: 321.5,
                quarantined: 0,
                redis_pending: 0,
                redis_live_reservations: 97,
            },
            send_latency_p50_ms: 1.25,
            send_latency_p99_ms: 9.75,
            publish_batches: 12,
            sends: Sends {
                confirmed: 98,
                unknown: 2,
                failed: 0,
            },
            scanner_resent: 3,
            handed_to_scanner: 1,
            peak_lag_messages: 64,
            peak_lag_seconds: 0.35,
            quiet: true,
            quiet_after_seconds: 1.5,
            lifecycle: Some(LifecycleSummary {
                pay_attempted: 50,
                pay_outcomes: count(&[("PAID", 48), ("CANCELED", 2)]),
                orders_paid: 48,
                orders_canceled: 49,
                orders_unpaid: 0,
                canceled_by_timer_message: 40,
                canceled_by_sweep: 9,
                compensations_released: 50,
                compensations_pending: 0,
                settled: true,
                settled_after_seconds: 61.25,
            }),
        }
    }

    fn shown(format: OutputFormat, s: &Summary) -> String {
        let mut out = Vec::new();
        render(&mut out, format, s).unwrap();
        String::from_utf8(out).unwrap()
    }

    /// The table for the fixture, byte for byte, as `seckillctl bench`
    /// printed it before `run` and `table` were split into phases.
    const TABLE: &str = r#"┌────────────────────────────────────────────────────┬───────────────────────────────────────────┐
│ FIGURE                                             ┆ VALUE                                     │
╞════════════════════════════════════════════════════╪═══════════════════════════════════════════╡
│ offered                                            ┆ 1100 requests at 500/s over 2.00 s        │
│ accepted (202 QUEUED)                              ┆ 100 (98 distinct reservations)            │
│ rejected at ingress: 503 Service Unavailable       ┆ 4                                         │
│ rejected at ingress: SOLD_OUT                      ┆ 990                                       │
│ ingress errors                                     ┆ 6                                         │
│ reservation throughput                             ┆ 50/s                                      │
│ outcome: ORDER_CREATED                             ┆ 97                                        │
│ outcome: REJECTED_EXPIRED                          ┆ 1                                         │
│ send latency p50 / p99                             ┆ 1.2 / 9.8 ms (12 batches)                 │
│ order-consume rate                                 ┆ 322 orders/s                              │
│ end to end p50 / p99 / p99.9                       ┆ 12 / 89 / 90 ms (n=98)                    │
│ peak lag                                           ┆ 64 messages, 0.3 s                        │
│ sends (engine)                                     ┆ 98 confirmed, 2 unknown, 0 failed         │
│ scanner re-sends                                   ┆ 3 (1 handed over unsent by the publisher) │
│ quarantined (all activities)                       ┆ 0                                         │
│ pay attempts                                       ┆ 50 (CANCELED 2, PAID 48)                  │
│ orders paid / canceled / still unpaid              ┆ 48 / 49 / 0                               │
│ canceled by timer message / by sweep (engine-wide) ┆ 40 / 9                                    │
│ compensations released / pending                   ┆ 50 / 0                                    │
│ lifecycle settled                                  ┆ true after 61.2 s                         │
│ quiet                                              ┆ true after 1.5 s (pending 0, live 97)     │
└────────────────────────────────────────────────────┴───────────────────────────────────────────┘
"#;

    /// The same without `--pay-share`: no lifecycle rows, a narrower column.
    const TABLE_WITHOUT_LIFECYCLE: &str = r#"┌──────────────────────────────────────────────┬───────────────────────────────────────────┐
│ FIGURE                                       ┆ VALUE                                     │
╞══════════════════════════════════════════════╪═══════════════════════════════════════════╡
│ offered                                      ┆ 1100 requests at 500/s over 2.00 s        │
│ accepted (202 QUEUED)                        ┆ 100 (98 distinct reservations)            │
│ rejected at ingress: 503 Service Unavailable ┆ 4                                         │
│ rejected at ingress: SOLD_OUT                ┆ 990                                       │
│ ingress errors                               ┆ 6                                         │
│ reservation throughput                       ┆ 50/s                                      │
│ outcome: ORDER_CREATED                       ┆ 97                                        │
│ outcome: REJECTED_EXPIRED                    ┆ 1                                         │
│ send latency p50 / p99                       ┆ 1.2 / 9.8 ms (12 batches)                 │
│ order-consume rate                           ┆ 322 orders/s                              │
│ end to end p50 / p99 / p99.9                 ┆ 12 / 89 / 90 ms (n=98)                    │
│ peak lag                                     ┆ 64 messages, 0.3 s                        │
│ sends (engine)                               ┆ 98 confirmed, 2 unknown, 0 failed         │
│ scanner re-sends                             ┆ 3 (1 handed over unsent by the publisher) │
│ quarantined (all activities)                 ┆ 0                                         │
│ quiet                                        ┆ true after 1.5 s (pending 0, live 97)     │
└──────────────────────────────────────────────┴───────────────────────────────────────────┘
"#;

    #[test]
    fn the_table_is_pinned() {
        assert_eq!(shown(OutputFormat::Table, &fixture()), TABLE);
        let without = Summary {
            lifecycle: None,
            ..fixture()
        };
        assert_eq!(
            shown(OutputFormat::Table, &without),
            TABLE_WITHOUT_LIFECYCLE
        );
    }

    fn json(v: &impl Serialize) -> Vec<u8> {
        serde_json::to_vec(v).unwrap()
    }

    fn api_error(code: &str) -> Vec<u8> {
        json(&ApiError {
            error: code.into(),
            reason: "for people".into(),
            retryable: false,
        })
    }

    #[test]
    fn a_queued_answer_names_its_reservation() {
        let id = ReservationId::generate();
        let body = json(&Queued {
            status: "QUEUED".into(),
            reservation_id: id.clone(),
            order_id: OrderId::generate(),
            message_id: MessageId::generate(),
            trace_id: None,
        });
        assert_eq!(
            answer(StatusCode::ACCEPTED, &body),
            Answer::Accepted(Some(id))
        );
    }

    #[test]
    fn an_unreadable_body_is_counted_not_fatal() {
        assert_eq!(
            answer(StatusCode::ACCEPTED, b"not json"),
            Answer::Accepted(None)
        );
        assert_eq!(
            answer(StatusCode::SERVICE_UNAVAILABLE, b"<html>"),
            Answer::Rejected("503 Service Unavailable".into())
        );
        assert_eq!(
            answer(StatusCode::NOT_FOUND, b""),
            Answer::Rejected("404 Not Found".into())
        );
        assert_eq!(
            pay_outcome(StatusCode::BAD_GATEWAY, b"{"),
            "502 Bad Gateway"
        );
    }

    #[test]
    fn a_refusal_is_counted_by_its_error_code() {
        assert_eq!(
            answer(StatusCode::CONFLICT, &api_error("SOLD_OUT")),
            Answer::Rejected("SOLD_OUT".into())
        );
        assert_eq!(
            pay_outcome(StatusCode::CONFLICT, &api_error("WINDOW_CLOSED")),
            "WINDOW_CLOSED"
        );
    }

    #[test]
    fn a_pay_answer_is_counted_by_its_outcome() {
        let body = json(&PayView {
            outcome: "ALREADY_PAID".into(),
            order: None,
        });
        assert_eq!(pay_outcome(StatusCode::OK, &body), "ALREADY_PAID");
    }

    #[test]
    fn the_tally_counts_every_answer_and_each_reservation_once() {
        let id = ReservationId::generate();
        let mut t = Tally::default();
        for a in [
            Answer::Accepted(Some(id.clone())),
            Answer::Accepted(Some(id)),
            Answer::Accepted(None),
            Answer::Rejected("SOLD_OUT".into()),
            Answer::Rejected("SOLD_OUT".into()),
            Answer::Failed,
        ] {
            t.count(a);
        }
        let i = t.into_ingress();
        assert_eq!(
            (i.offered, i.accepted, i.errors, i.distinct_reservations),
            (6, 3, 1, 1)
        );
        assert_eq!(i.rejected, BTreeMap::from([("SOLD_OUT".to_owned(), 2)]));
    }

    #[test]
    fn every_duplicate_request_repeats_its_request_id() {
        #[derive(clap::Parser)]
        struct Cli {
            #[command(subcommand)]
            cmd: BenchCmd,
        }
        let cli = <Cli as clap::Parser>::parse_from([
            "bench",
            "flash-sale",
            "--activity",
            "1",
            "--sku",
            "1",
            "--stock",
            "1",
            "--users",
            "50",
            "--rate",
            "1",
            "--dup-requests",
            "1",
        ]);
        let BenchCmd::FlashSale(args) = cli.cmd;
        let reqs = plan(&args);
        assert_eq!(reqs.len(), 100);
        let mut per_request: BTreeMap<(i64, &str), u32> = BTreeMap::new();
        for r in &reqs {
            *per_request.entry((r.user_id, &r.request_id)).or_default() += 1;
        }
        assert_eq!(per_request.len(), 50);
        assert!(per_request.values().all(|n| *n == 2));
        assert!(
            per_request
                .keys()
                .all(|(u, _)| (90_000_000..90_000_050).contains(u))
        );
    }
}
