//! `seckillctl bench flash-sale`: drives the engine's HTTP ingress like a
//! flash-sale crowd, waits until the pipeline is quiet, and summarises what
//! happened. A benchmark, not a test: it reports figures, it asserts nothing.

use crate::output::{OutputFormat, Tabular, new_table, render};
use anyhow::{Context, Result, bail};
use rand::seq::SliceRandom;
use seckill_engine::{
    ActivityId, ClientRuntime, Config, Names, NewActivity, PipelineFacts, RequestId,
    ReservationStore, RocketAdmin, SkuId, StatsView, TopicKind, activity, db, facts, order,
    redis_conn,
};
use serde::Serialize;
use std::collections::{BTreeMap, HashSet};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};
use tokio::sync::Semaphore;

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
    #[arg(long, value_parser = crate::cmd::mq::parse_duration, default_value = "15m")]
    pay_within: Duration,
    /// Share of created orders to pay (0..1). When given, the bench then
    /// waits until every unpaid order is canceled and every compensation
    /// is released in Redis
    #[arg(long)]
    pay_share: Option<f64>,
    /// Give up waiting for the pipeline to go quiet after this long
    #[arg(long, value_parser = crate::cmd::mq::parse_duration, default_value = "180s")]
    quiet_timeout: Duration,
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
        let mut row = |k: &str, v: String| {
            t.add_row([k.to_owned(), v]);
        };
        row(
            "offered",
            format!(
                "{} requests at {}/s over {:.2} s",
                self.ingress.offered, self.rate_offered, self.burst_seconds
            ),
        );
        row(
            "accepted (202 QUEUED)",
            format!(
                "{} ({} distinct reservations)",
                self.ingress.accepted, self.ingress.distinct_reservations
            ),
        );
        for (k, v) in &self.ingress.rejected {
            row(&format!("rejected at ingress: {k}"), v.to_string());
        }
        row("ingress errors", self.ingress.errors.to_string());
        row(
            "reservation throughput",
            format!("{:.0}/s", self.reservation_throughput),
        );
        for (k, v) in &self.pipeline.outcomes {
            row(&format!("outcome: {k}"), v.to_string());
        }
        row(
            "send latency p50 / p99",
            format!(
                "{:.1} / {:.1} ms ({} batches)",
                self.send_latency_p50_ms, self.send_latency_p99_ms, self.publish_batches
            ),
        );
        row(
            "order-consume rate",
            format!("{:.0} orders/s", self.pipeline.consume_rate),
        );
        let e = &self.pipeline.end_to_end;
        row(
            "end to end p50 / p99 / p99.9",
            format!(
                "{:.0} / {:.0} / {:.0} ms (n={})",
                e.p50_ms, e.p99_ms, e.p999_ms, e.count
            ),
        );
        row(
            "peak lag",
            format!(
                "{} messages, {:.1} s",
                self.peak_lag_messages, self.peak_lag_seconds
            ),
        );
        row(
            "scanner re-sends",
            format!(
                "{} ({} handed over unsent by the publisher)",
                self.scanner_resent, self.handed_to_scanner
            ),
        );
        row(
            "quarantined (all activities)",
            self.pipeline.quarantined.to_string(),
        );
        if let Some(l) = &self.lifecycle {
            let outcomes: Vec<String> = l
                .pay_outcomes
                .iter()
                .map(|(k, v)| format!("{k} {v}"))
                .collect();
            row(
                "pay attempts",
                format!("{} ({})", l.pay_attempted, outcomes.join(", ")),
            );
            row(
                "orders paid / canceled / still unpaid",
                format!(
                    "{} / {} / {}",
                    l.orders_paid, l.orders_canceled, l.orders_unpaid
                ),
            );
            row(
                "canceled by timer message / by sweep (engine-wide)",
                format!("{} / {}", l.canceled_by_timer_message, l.canceled_by_sweep),
            );
            row(
                "compensations released / pending",
                format!("{} / {}", l.compensations_released, l.compensations_pending),
            );
            row(
                "lifecycle settled",
                format!("{} after {:.1} s", l.settled, l.settled_after_seconds),
            );
        }
        row(
            "quiet",
            format!(
                "{} after {:.1} s (pending {}, live {})",
                self.quiet,
                self.quiet_after_seconds,
                self.pipeline.redis_pending,
                self.pipeline.redis_live_reservations
            ),
        );
        t
    }
}

struct Req {
    user: u64,
    request_id: RequestId,
}

fn plan(args: &FlashSaleArgs) -> Vec<Req> {
    let mut rng = rand::rng();
    let base = 90_000_000u64;
    let mut reqs: Vec<Req> = (0..args.users)
        .map(|i| Req {
            user: base + i,
            request_id: RequestId::generate(),
        })
        .collect();
    let n = reqs.len();
    let mut extra = Vec::new();
    for r in reqs.iter().take(n) {
        if rand::random::<f64>() < args.dup_requests {
            extra.push(Req {
                user: r.user,
                request_id: r.request_id.clone(),
            });
        }
        if rand::random::<f64>() < args.repeat_users {
            extra.push(Req {
                user: r.user,
                request_id: RequestId::generate(),
            });
        }
    }
    reqs.extend(extra);
    reqs.shuffle(&mut rng);
    reqs
}

pub async fn run(cmd: BenchCmd, cfg: &Config, rt: Arc<ClientRuntime>) -> Result<()> {
    let BenchCmd::FlashSale(args) = cmd;
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
    let pool = db::connect(cfg).await?;
    let store = ReservationStore::new(redis_conn::connect(cfg).await?, cfg.redis_prefix.clone());
    let http = reqwest::Client::builder()
        .pool_max_idle_per_host(args.concurrency)
        .timeout(Duration::from_secs(10))
        .build()?;
    http.get(format!("{}/readyz", args.engine))
        .send()
        .await
        .and_then(|r| r.error_for_status())
        .with_context(|| {
            format!(
                "the engine at {} is not ready; start it with `seckillctl engine run`",
                args.engine
            )
        })?;

    activity::create(
        &pool,
        &store,
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

    let reqs = plan(&args);
    let names = Names::new(cfg.topic_prefix.clone());
    let admin = RocketAdmin::start(rt, &cfg.namesrv_addr, cfg.admin_timeout()).await?;
    let (topic, group) = (
        names.topic(TopicKind::OrderCreate),
        names.group(TopicKind::OrderCreate),
    );
    let peak = Arc::new(Mutex::new((0i64, 0f64)));
    let sampling = Arc::new(std::sync::atomic::AtomicBool::new(true));
    let sampler = {
        let (peak, sampling) = (peak.clone(), sampling.clone());
        async move {
            while sampling.load(std::sync::atomic::Ordering::Relaxed) {
                if let Ok(l) = admin.lag(&topic, &group).await {
                    let mut p = peak.lock().unwrap_or_else(|e| e.into_inner());
                    p.0 = p.0.max(l.messages);
                    p.1 = p.1.max(l.seconds);
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            admin.shutdown().await;
        }
    };
    let sampler = tokio::spawn(sampler);

    let ingress = Arc::new(Mutex::new(Ingress::default()));
    let distinct = Arc::new(Mutex::new(HashSet::<String>::new()));
    let sem = Arc::new(Semaphore::new(args.concurrency));
    let started = Instant::now();
    let interval = Duration::from_secs_f64(1.0 / args.rate as f64);
    let url = format!(
        "{}/v1/activities/{}/skus/{}/reservations",
        args.engine, args.activity, args.sku
    );
    let mut last_progress = Instant::now();
    let total = reqs.len();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, r) in reqs.into_iter().enumerate() {
        let due = started + interval.mul_f64(i as f64);
        tokio::time::sleep_until(due.into()).await;
        let permit = sem.clone().acquire_owned().await?;
        let (http, url, tally, seen) =
            (http.clone(), url.clone(), ingress.clone(), distinct.clone());
        tasks.spawn(async move {
            let resp = http
                .post(&url)
                .json(&serde_json::json!({"user_id": r.user, "request_id": r.request_id.as_str()}))
                .send()
                .await;
            let outcome = match resp {
                Ok(resp) => {
                    let code = resp.status();
                    let body: serde_json::Value = resp.json().await.unwrap_or_default();
                    Some((code, body))
                }
                Err(_) => None,
            };
            let mut g = tally.lock().unwrap_or_else(|e| e.into_inner());
            g.offered += 1;
            match outcome {
                Some((code, body)) if code.as_u16() == 202 => {
                    g.accepted += 1;
                    if let Some(id) = body["reservation_id"].as_str() {
                        seen.lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .insert(id.to_owned());
                    }
                }
                Some((code, body)) => {
                    let reason = body["error"]
                        .as_str()
                        .map_or_else(|| code.to_string(), str::to_owned);
                    *g.rejected.entry(reason).or_default() += 1;
                }
                None => g.errors += 1,
            }
            drop(permit);
        });
        while tasks.try_join_next().is_some() {}
        if last_progress.elapsed() >= Duration::from_secs(1) {
            last_progress = Instant::now();
            let g = ingress.lock().unwrap_or_else(|e| e.into_inner()).clone();
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
    let burst = started.elapsed().as_secs_f64();
    let mut ingress = ingress.lock().unwrap_or_else(|e| e.into_inner()).clone();
    ingress.distinct_reservations = distinct.lock().unwrap_or_else(|e| e.into_inner()).len() as u64;
    eprintln!("[bench] burst done in {burst:.2} s; waiting for the pipeline to go quiet");

    // Poll the cheap progress counters, not the full facts: reading every
    // decision's latency ten times a second would slow the consumer being
    // measured.
    let quiet_started = Instant::now();
    let quiet = loop {
        let p = facts::progress(&pool, &store, args.activity).await?;
        if p.decided as u64 >= ingress.distinct_reservations && p.redis_pending == 0 {
            break true;
        }
        if quiet_started.elapsed() > args.quiet_timeout {
            break false;
        }
        if last_progress.elapsed() >= Duration::from_secs(1) {
            last_progress = Instant::now();
            eprintln!(
                "[bench] decided {}/{}, pending sends {}",
                p.decided, ingress.distinct_reservations, p.redis_pending
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let quiet_after = quiet_started.elapsed().as_secs_f64();
    let facts = facts::collect(&pool, &store, args.activity).await?;
    sampling.store(false, std::sync::atomic::Ordering::Relaxed);
    let _ = sampler.await;
    let mut lifecycle = match args.pay_share {
        Some(share) => Some(pay_and_settle(&args, &pool, &http, share).await?),
        None => None,
    };
    let stats: StatsView = http
        .get(format!("{}/v1/stats", args.engine))
        .send()
        .await?
        .json()
        .await
        .context("read the engine's /v1/stats")?;
    if let Some(l) = lifecycle.as_mut() {
        l.canceled_by_timer_message = stats.lifecycle.canceled;
        l.canceled_by_sweep = stats.lifecycle.sweep_canceled;
    }
    let (peak_lag_messages, peak_lag_seconds) = *peak.lock().unwrap_or_else(|e| e.into_inner());
    let summary = Summary {
        activity_id: args.activity,
        stock: args.stock,
        users: args.users,
        rate_offered: args.rate,
        burst_seconds: burst,
        reservation_throughput: ingress.accepted as f64 / burst.max(1e-9),
        ingress,
        pipeline: facts,
        send_latency_p50_ms: stats.send_latency.p50_ms,
        send_latency_p99_ms: stats.send_latency.p99_ms,
        publish_batches: stats.publish_batches,
        scanner_resent: stats.scanner_resent,
        handed_to_scanner: stats.publish_handed_to_scanner,
        peak_lag_messages,
        peak_lag_seconds,
        quiet,
        quiet_after_seconds: quiet_after,
        lifecycle,
    };
    render(&mut std::io::stdout().lock(), args.output, &summary)
}

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
    let mut summary = LifecycleSummary {
        pay_attempted: orders.len() as u64,
        ..LifecycleSummary::default()
    };
    let sem = Arc::new(Semaphore::new(args.concurrency.min(64)));
    let mut tasks = tokio::task::JoinSet::new();
    for id in orders {
        let (http, sem) = (http.clone(), sem.clone());
        let url = format!("{}/v1/orders/{id}/pay", args.engine);
        tasks.spawn(async move {
            let _permit = sem.acquire_owned().await;
            match http.post(&url).json(&serde_json::json!({})).send().await {
                Ok(r) => {
                    let code = r.status();
                    let body: serde_json::Value = r.json().await.unwrap_or_default();
                    body["outcome"]
                        .as_str()
                        .or(body["error"].as_str())
                        .map_or_else(|| code.to_string(), str::to_owned)
                }
                Err(e) => format!("ERROR: {e}"),
            }
        });
    }
    while let Some(done) = tasks.join_next().await {
        let outcome = done.unwrap_or_else(|e| format!("ERROR: {e}"));
        *summary.pay_outcomes.entry(outcome).or_default() += 1;
    }

    eprintln!(
        "[bench] waiting for unpaid orders to cancel (pay window {} s) and compensations to settle",
        args.pay_within.as_secs()
    );
    let started = Instant::now();
    let limit = args.pay_within + args.quiet_timeout;
    let mut last_progress = Instant::now();
    loop {
        let f = facts::lifecycle(pool, args.activity).await?;
        let (paid, canceled, unpaid, released, pending) = (
            f.paid,
            f.canceled,
            f.unpaid,
            f.compensations_settled,
            f.compensations_pending,
        );
        summary.orders_paid = paid;
        summary.orders_canceled = canceled;
        summary.orders_unpaid = unpaid;
        summary.compensations_released = released;
        summary.compensations_pending = pending;
        summary.settled = unpaid == 0 && pending == 0;
        summary.settled_after_seconds = started.elapsed().as_secs_f64();
        if summary.settled || started.elapsed() > limit {
            return Ok(summary);
        }
        if last_progress.elapsed() >= Duration::from_secs(2) {
            last_progress = Instant::now();
            eprintln!(
                "[bench] paid {paid}, canceled {canceled}, unpaid {unpaid}, compensations pending {pending}"
            );
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
