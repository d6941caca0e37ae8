//! Runs one drill: a sale on the private servers, the injection at its
//! moment, the wait for quiet, the figures and the verdict.

use super::catalog::DrillName;
use super::faults::{Fault, apply, hold_sku_row, restart_broker};
use super::pg::{PrivatePg, RestartMode};
use super::procs::Signal;
use super::servers::World;
use super::stage::{Crowd, SalePlan, Stage};
use super::verdict::{Figures, Targets, Verdict, judge};
use anyhow::{Context, Result};
use chrono::{DateTime, Utc};
use seckill_engine::{ClientRuntime, Config, TopicKind, facts};
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One drill's result.
#[derive(Debug, Clone, Serialize)]
pub struct DrillReport {
    pub drill: DrillName,
    pub seconds: f64,
    pub figures: Figures,
    pub targets: Targets,
    #[serde(flatten)]
    pub verdict: Verdict,
}

/// What the injection did, for the figures.
struct Injected {
    /// Wall clock when the fault began, to find the reservations it touched.
    began: DateTime<Utc>,
    /// When the fault healed (the server answers again, the lock is
    /// released), or when it was injected if nothing heals it.
    healed: Instant,
    healed_wall: DateTime<Utc>,
    /// Reservations the drill expects never to be decided (the poison).
    dead: u64,
    /// Accepted reservations Redis lost before they were sent (the restore
    /// counts them): never decided, never in Redis again.
    lost: u64,
    /// An engine was killed: its send counters died with it.
    engine_killed: bool,
    /// What the injection itself saw go wrong (see [`Figures::unmet`]).
    unmet: Vec<String>,
    notes: Vec<String>,
}

impl Injected {
    fn begin() -> (DateTime<Utc>, Vec<String>) {
        (Utc::now(), Vec::new())
    }

    fn killed(self) -> Self {
        Self {
            engine_killed: true,
            ..self
        }
    }

    fn healed_now(began: DateTime<Utc>, notes: Vec<String>) -> Self {
        Self {
            began,
            healed: Instant::now(),
            healed_wall: Utc::now(),
            dead: 0,
            lost: 0,
            engine_killed: false,
            notes,
            unmet: Vec::new(),
        }
    }
}

/// The user the poison drill's trigger refuses: the eighth of the crowd,
/// early enough to win a unit of stock.
const POISON_USER: i64 = 70_000_007;

/// The users whose orders the singleton-takeover drill refuses: spread
/// over the first 1,000 requests, so their deaths reach the DLQ over more
/// than one mirror pass, and each early enough to win stock.
const TAKEOVER_POISON: [i64; 3] = [70_000_007, 70_000_507, 70_000_907];

/// A drill judges how a fault's sends are handled (sends per affected
/// reservation, §13.5), so the engines' send timeout is pinned well above
/// what a debug build on a loaded box takes for a healthy send, whatever
/// the default: slow healthy sends would read as UNKNOWN and count against
/// the fault.
pub(crate) const DRILL_SEND_TIMEOUT: &str = "send_timeout_ms = 3000\n";

/// The drill's engine settings, in `seckill.toml` form: the defaults,
/// with few retries so a dead message reaches the DLQ within the drill.
fn engine_toml(name: DrillName) -> String {
    let consumer = match name {
        // A slow drain, so the kill or the stop lands while batches are in
        // flight, and the frozen backlog outlives its reservations.
        DrillName::ConsumerKill | DrillName::ConsumerRestart => {
            "[consumer]\nbatch_max = 1\nthreads = 2\n"
        }
        DrillName::BacklogExpiry => "[consumer]\nbatch_max = 1\nthreads = 1\n",
        // More threads wanted than the pool's budget (8 x 0.5 = 4).
        DrillName::ScaleToSaturation => {
            "[consumer]\nbatch_max = 16\nthreads = 16\n[pg]\nmax_connections = 8\n"
        }
        _ => "[consumer]\nbatch_max = 16\nthreads = 4\n",
    };
    format!(
        "{consumer}[publisher]\nbatch_max = 16\n[mq]\nmax_reconsume_times = 2\n{DRILL_SEND_TIMEOUT}[dlq]\nmirror_interval_ms = 1000\n"
    )
}

fn sale_plan(name: DrillName) -> SalePlan {
    match name {
        DrillName::BacklogExpiry => SalePlan {
            valid_for_ms: 6_000,
            ..SalePlan::default()
        },
        DrillName::CancelEarlyLate => SalePlan {
            pay_within_ms: 10_000,
            ..SalePlan::default()
        },
        // Slow enough that the three restarts land while the crowd buys.
        DrillName::RollingRestart => SalePlan {
            rate: 100,
            ..SalePlan::default()
        },
        _ => SalePlan::default(),
    }
}

pub async fn run_one(
    name: DrillName,
    base: &Config,
    world: &mut World,
    rt: Arc<ClientRuntime>,
    port_base: u16,
) -> Result<DrillReport> {
    let started = Instant::now();
    let spec = name.spec();
    eprintln!("[drill {}] {}", name.as_str(), spec.injection);
    // The failover drill restarts its own PostgreSQL, never the stack's.
    let pg = match name {
        DrillName::PgFailover => Some(
            PrivatePg::start(&world.dir().join("pg-failover-server"), port_base + 5)
                .await
                .context("start the drill's own PostgreSQL")?,
        ),
        _ => None,
    };
    let mut on_pg = base.clone();
    if let Some(pg) = &pg {
        on_pg.database_url = secrecy::SecretString::from(pg.url("postgres"));
    }
    let stage = Stage::prepare(
        name.as_str(),
        &on_pg,
        world,
        rt,
        sale_plan(name),
        &engine_toml(name),
        port_base,
    )
    .await
    .with_context(|| format!("prepare the {} drill", name.as_str()));
    let mut stage = match stage {
        Ok(s) => s,
        Err(e) => {
            if let Some(pg) = &pg {
                pg.stop().await;
            }
            return Err(e);
        }
    };
    let figures = drive(name, world, &mut stage, pg.as_ref()).await;
    stage.finish().await;
    if let Some(pg) = &pg {
        pg.stop().await;
    }
    let figures = figures?;
    let verdict = judge(&figures, &spec.targets);
    Ok(DrillReport {
        drill: name,
        seconds: started.elapsed().as_secs_f64(),
        figures,
        targets: spec.targets,
        verdict,
    })
}

async fn drive(
    name: DrillName,
    world: &mut World,
    stage: &mut Stage,
    pg: Option<&PrivatePg>,
) -> Result<Figures> {
    for i in 0..name.spec().engines {
        stage.start_engine(i).await?;
    }
    match name {
        DrillName::Poison | DrillName::DlqReplayTwice => {
            install_poison(stage, &[POISON_USER]).await?
        }
        DrillName::SingletonTakeover => install_poison(stage, &TAKEOVER_POISON).await?,
        _ => {}
    }
    let crowd = stage.start_crowd();
    let injected = inject(name, world, stage, &crowd, pg).await?;
    let tally = crowd.finish().await;
    let accepted = tally.distinct();
    eprintln!(
        "[drill {}] crowd done: {accepted} accepted, {} unanswered; waiting for quiet",
        name.as_str(),
        tally.failed.load(std::sync::atomic::Ordering::Relaxed)
    );
    let limit = Duration::from_secs_f64(name.spec().targets.recovery_s * 3.0 + 30.0);
    let quiet = stage
        .wait_quiet(accepted.saturating_sub(injected.lost), injected.dead, limit)
        .await?;
    let recovery_s = quiet.map(|at| at.saturating_duration_since(injected.healed).as_secs_f64());
    let mut injected = injected;
    if name == DrillName::SingletonTakeover {
        // Quiet came first; the refused orders die after their retries.
        mirrored_once(stage, &mut injected).await?;
    }
    if name == DrillName::Poison {
        // Quiet came first (every other order made); the poison itself
        // reaches the DLQ after its retries.
        let started = Instant::now();
        wait_dead_message(stage, Duration::from_secs(150)).await?;
        injected.notes.push(format!(
            "the poison reached the DLQ {:.0} s after quiet",
            started.elapsed().as_secs_f64()
        ));
    }
    let mut f = figures(
        stage,
        &injected,
        accepted,
        tally.failed.load(std::sync::atomic::Ordering::Relaxed),
        recovery_s,
    )
    .await?;
    match name {
        DrillName::BacklogExpiry => expired_check(stage, &mut f).await?,
        DrillName::DlqReplayTwice => one_order_for_poison_user(stage, &mut f).await?,
        DrillName::CancelEarlyLate if quiet.is_some() => {
            super::lifecycle::early_and_late_cancels(stage, &mut f).await?
        }
        _ => {}
    }
    Ok(f)
}

async fn inject(
    name: DrillName,
    world: &mut World,
    stage: &mut Stage,
    crowd: &Crowd,
    pg: Option<&PrivatePg>,
) -> Result<Injected> {
    let users = stage.plan.users;
    match name {
        DrillName::EngineKill => {
            crowd.until_sent(users * 2 / 5).await;
            let (began, mut notes) = Injected::begin();
            notes.push(format!("after {} requests", crowd.sent()));
            notes.push(apply(Fault::KillEngine(0), world, stage).await?);
            Ok(Injected::killed(Injected::healed_now(began, notes)))
        }
        DrillName::ConsumerKill => {
            crowd.until_sent(users).await;
            let stock = stage.plan.stock;
            let decided = wait_decided(stage, stock / 4, Duration::from_secs(60)).await?;
            let (began, mut notes) = Injected::begin();
            let pid = stage.kill_engine(0).await.unwrap_or(0);
            notes.push(format!(
                "engine (pid {pid}) killed with {decided} of {stock} decided"
            ));
            stage.start_engine(0).await?;
            Ok(Injected::killed(Injected::healed_now(began, notes)))
        }
        DrillName::BrokerRestart => {
            crowd.until_sent(users * 3 / 10).await;
            let (began, mut notes) = Injected::begin();
            notes.push(format!("after {} requests", crowd.sent()));
            // While it is down, what on-call's commands say (the playbook).
            let probe = async { during_outage(stage).await.map(Some) };
            notes.push(restart_broker(world, probe).await?);
            Ok(Injected::healed_now(began, notes))
        }
        DrillName::NetworkCut => {
            crowd.until_sent(users * 3 / 10).await;
            let (began, mut notes) = Injected::begin();
            notes.push(format!("after {} requests", crowd.sent()));
            notes.push(apply(Fault::CutLink, world, stage).await?);
            Ok(Injected::healed_now(began, notes))
        }
        DrillName::Poison => {
            let (began, notes) = Injected::begin();
            Ok(Injected {
                dead: 1,
                ..Injected::healed_now(began, notes)
            })
        }
        DrillName::SkuLock => {
            crowd.until_sent(users * 3 / 10).await;
            let (began, mut notes) = Injected::begin();
            notes.push(apply(Fault::LockSku, world, stage).await?);
            Ok(Injected::healed_now(began, notes))
        }
        DrillName::ConsumerRestart => {
            crowd.until_sent(users).await;
            let stock = stage.plan.stock;
            let decided = wait_decided(stage, stock / 4, Duration::from_secs(60)).await?;
            let (began, mut notes) = Injected::begin();
            let pids = stage.stop_engines(Duration::from_secs(10)).await;
            notes.push(format!(
                "engines {pids:?} stopped at once with {decided} of {stock} decided; started again"
            ));
            for i in 0..2 {
                stage.start_engine(i).await?;
            }
            Ok(Injected::killed(Injected::healed_now(began, notes)))
        }
        DrillName::BacklogExpiry => {
            crowd.until_sent(users).await;
            let (began, mut notes) = Injected::begin();
            let p = facts::progress(&stage.pool, &stage.store, stage.activity).await?;
            stage.signal_engine(0, Signal::Stop);
            tokio::time::sleep(Duration::from_secs(8)).await;
            stage.signal_engine(0, Signal::Cont);
            notes.push(format!(
                "engine frozen for 8 s with {} of {} decided",
                p.decided, stage.plan.stock
            ));
            Ok(Injected::healed_now(began, notes))
        }
        DrillName::DlqReplayTwice => {
            crowd.until_sent(users).await;
            let (began, mut notes) = Injected::begin();
            let id = wait_dead_message(stage, Duration::from_secs(150)).await?;
            sqlx::raw_sql("DROP TRIGGER drill_poison ON orders")
                .execute(&stage.pool)
                .await
                .context("drop the poison trigger")?;
            for n in 1..=2 {
                let (code, out) = stage
                    .seckillctl(&[
                        "dlq",
                        "replay",
                        "--message-id",
                        &id,
                        "--reason",
                        "drill: trigger dropped",
                    ])
                    .await?;
                notes.push(format!(
                    "replay {n}: exit {code}, {}",
                    replay_decision(&out)
                ));
            }
            Ok(Injected::healed_now(began, notes))
        }
        DrillName::CancelEarlyLate => {
            let (began, notes) = Injected::begin();
            Ok(Injected::healed_now(began, notes))
        }
        DrillName::RollingRestart => rolling_restart(stage, crowd).await,
        DrillName::SingletonTakeover => {
            crowd.until_sent(users).await;
            singleton_takeover(stage).await
        }
        DrillName::PgFailover => {
            let pg = pg.context("the failover drill runs on its own PostgreSQL")?;
            crowd.until_sent(users * 3 / 10).await;
            let (began, mut notes) = Injected::begin();
            let t = Instant::now();
            pg.restart(RestartMode::Fast).await?;
            notes.push(format!(
                "fast restart after {} requests took {:.1} s",
                crowd.sent(),
                t.elapsed().as_secs_f64()
            ));
            let t = Instant::now();
            pg.restart(RestartMode::Immediate).await?;
            notes.push(format!(
                "immediate restart (crash recovery) took {:.1} s",
                t.elapsed().as_secs_f64()
            ));
            Ok(Injected::healed_now(began, notes))
        }
        DrillName::ScaleToSaturation => {
            crowd.until_sent(users * 3 / 10).await;
            let (began, mut notes) = Injected::begin();
            let before = governor(stage).await.map_or(0, |g| g.limit);
            let hold = Duration::from_secs(6);
            let (held, samples, advice) = tokio::join!(
                hold_sku_row(stage, hold),
                sample_governor(stage, hold),
                async {
                    tokio::time::sleep(Duration::from_secs(3)).await;
                    advise(stage).await
                }
            );
            held?;
            let max = samples.iter().map(|g| g.limit).max().unwrap_or(0);
            let budget = samples.iter().map(|g| g.budget).max().unwrap_or(0);
            notes.push(format!(
                "SKU row held 6 s; consumer concurrency {before} before, at most {max} while saturated (budget {budget}); scale advise: {}",
                advice.as_deref().unwrap_or("no answer")
            ));
            let mut injected = Injected::healed_now(began, notes);
            if samples.iter().any(|g| g.limit > g.budget) {
                injected
                    .unmet
                    .push(format!("concurrency {max} went past the budget {budget}"));
            }
            if max > before {
                injected.unmet.push(format!(
                    "concurrency rose from {before} to {max} while PostgreSQL was saturated"
                ));
            }
            if advice.as_deref() == Some("SCALE_OUT_CONSUMERS") {
                injected.unmet.push(
                    "scale advise said to add consumers to a saturated PostgreSQL".to_owned(),
                );
            }
            if samples.is_empty() {
                injected
                    .unmet
                    .push("no governor sample while saturated".to_owned());
            }
            Ok(injected)
        }
        DrillName::RedisRestart => {
            crowd.until_sent(users * 3 / 10).await;
            let (began, mut notes) = Injected::begin();
            world.restart_redis().await?;
            notes.push(format!(
                "Redis restarted empty after {} requests",
                crowd.sent()
            ));
            let mut unmet = Vec::new();
            match critical_redis_alert(stage, Duration::from_secs(20)).await? {
                Some(seen) => notes.push(seen),
                None => unmet.push("health never went critical with redis_state_lost".to_owned()),
            }
            let (lost, said) = restore(stage).await?;
            notes.push(said);
            Ok(Injected {
                lost,
                unmet,
                ..Injected::healed_now(began, notes)
            })
        }
        DrillName::EngineKillOneOfTwo => {
            crowd.until_sent(users * 2 / 5).await;
            let (began, mut notes) = Injected::begin();
            let pid = stage.kill_engine(1).await.unwrap_or(0);
            notes.push(format!(
                "engine 1 of 2 (pid {pid}) killed after {} requests",
                crowd.sent()
            ));
            Ok(Injected::killed(Injected::healed_now(began, notes)))
        }
    }
}

/// Polls `seckillctl health` until it exits critical with the
/// `redis_state_lost` alert firing, and says how long that took.
async fn critical_redis_alert(stage: &Stage, limit: Duration) -> Result<Option<String>> {
    let started = Instant::now();
    while started.elapsed() < limit {
        let (code, out) = stage
            .seckillctl(&["health", "--window", "1s", "-o", "json"])
            .await?;
        let health: serde_json::Value = serde_json::from_str(json_part(&out)).unwrap_or_default();
        let firing = health["alerts"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|a| a["metric"] == "redis_state_lost" && a["state"] == "CRITICAL");
        if let Some(a) = firing {
            return Ok(Some(format!(
                "health exit {code} after {:.1} s: redis_state_lost = {}",
                started.elapsed().as_secs_f64(),
                a["shown"].as_str().unwrap_or("?")
            )));
        }
    }
    Ok(None)
}

/// `seckillctl activity restore`, as on-call runs it; returns the
/// reservations it found lost unsent, and what it said.
async fn restore(stage: &Stage) -> Result<(u64, String)> {
    let activity = stage.activity.to_string();
    let started = Instant::now();
    let (code, out) = stage
        .seckillctl(&[
            "activity",
            "restore",
            "--activity",
            &activity,
            "--reason",
            "drill: Redis restarted empty",
            "-o",
            "json",
        ])
        .await?;
    let report: serde_json::Value = serde_json::from_str(json_part(&out)).unwrap_or_default();
    anyhow::ensure!(code == 0, "activity restore failed (exit {code}): {out}");
    let lost = report["lost_unsent"].as_u64().unwrap_or(0);
    Ok((
        lost,
        format!(
            "restore took {:.1} s: epoch {} -> {}, stock {}, {} buyers, {} unpaid re-armed, {} compensations settled, {lost} lost unsent",
            started.elapsed().as_secs_f64(),
            report["previous_epoch"],
            report["epoch"],
            report["stock"],
            report["buyers"],
            report["live_orders"],
            report["settled_compensations"],
        ),
    ))
}

/// A trigger in the drill's own database that refuses [`POISON_USER`]'s order.
async fn install_poison(stage: &Stage, users: &[i64]) -> Result<()> {
    let users: Vec<String> = users.iter().map(i64::to_string).collect();
    let users = users.join(", ");
    sqlx::raw_sql(&format!(
        "CREATE FUNCTION drill_poison() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF NEW.user_id IN ({users}) THEN
             RAISE EXCEPTION 'drill poison: the order of user % is refused', NEW.user_id;
           END IF;
           RETURN NEW;
         END $$;
         CREATE TRIGGER drill_poison BEFORE INSERT ON orders
           FOR EACH ROW EXECUTE FUNCTION drill_poison();"
    ))
    .execute(&stage.pool)
    .await
    .context("install the poison trigger")?;
    Ok(())
}

/// Dead messages whose effect is in PostgreSQL all the same (their inbox
/// row succeeded), once the DLQ mirror has all `dlq` of them (at most 15 s).
async fn dead_but_applied(stage: &Stage, dlq: i64) -> Result<i64> {
    let started = Instant::now();
    loop {
        let (mirrored, applied): (i64, i64) = sqlx::query_as(
            "SELECT count(*), count(i.message_id) FROM dlq_messages d
             LEFT JOIN consumer_inbox i ON i.consumer_group = d.consumer_group
               AND i.message_id = d.message_id AND i.status IN ('SUCCEEDED', 'REJECTED')",
        )
        .fetch_one(&stage.pool)
        .await?;
        if mirrored >= dlq || started.elapsed() > Duration::from_secs(15) {
            return Ok(applied);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `seckillctl health` and `backlog` against the drill's servers and its
/// first engine while the broker is down, in one line for the report.
async fn during_outage(stage: &Stage) -> Result<String> {
    let engine = stage.engine_urls().into_iter().next().unwrap_or_default();
    let (code, out) = stage
        .seckillctl(&[
            "--engine-url",
            &engine,
            "health",
            "--window",
            "1s",
            "-o",
            "json",
        ])
        .await?;
    let health: serde_json::Value = serde_json::from_str(json_part(&out)).unwrap_or_default();
    let not_up: Vec<String> = health["components"]
        .as_array()
        .into_iter()
        .flatten()
        .filter(|c| c["state"] != "UP")
        .map(|c| {
            format!(
                "{} {}",
                c["component"].as_str().unwrap_or("?"),
                c["state"].as_str().unwrap_or("?")
            )
        })
        .collect();
    let circuit = health["components"]
        .as_array()
        .into_iter()
        .flatten()
        .find(|c| {
            c["component"]
                .as_str()
                .is_some_and(|n| n.starts_with("engine"))
        })
        .and_then(|c| c["detail"].as_str())
        .map_or("no circuit detail", |d| d.split(':').next().unwrap_or(d))
        .to_owned();
    let (backlog_code, _) = stage
        .seckillctl(&["--engine-url", &engine, "backlog", "-o", "json"])
        .await?;
    Ok(format!(
        "during the outage: health exit {code} ({}; engine: {circuit}), backlog exit {backlog_code}",
        not_up.join(", ")
    ))
}

/// The JSON document in a command's output (stderr may follow it).
fn json_part(out: &str) -> &str {
    match (out.find('{'), out.rfind('}')) {
        (Some(a), Some(b)) if a < b => &out[a..=b],
        _ => "",
    }
}

async fn governor(stage: &Stage) -> Option<seckill_engine::GovernorView> {
    stage.stats().await.into_iter().next().map(|s| s.governor)
}

/// The engine's governor view every 200 ms for `span`.
async fn sample_governor(stage: &Stage, span: Duration) -> Vec<seckill_engine::GovernorView> {
    let started = Instant::now();
    let mut out = Vec::new();
    while started.elapsed() < span {
        out.extend(governor(stage).await);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    out
}

/// The action `seckillctl scale advise` picks now.
async fn advise(stage: &Stage) -> Option<String> {
    let engine = stage.engine_urls().into_iter().next()?;
    let (_, out) = stage
        .seckillctl(&["--engine-url", &engine, "scale", "advise", "-o", "json"])
        .await
        .ok()?;
    let v: serde_json::Value = serde_json::from_str(json_part(&out)).ok()?;
    v["advice"]["action"].as_str().map(str::to_owned)
}

/// The "decision X, outcome Y" part of a replay's report line.
fn replay_decision(out: &str) -> &str {
    out.lines()
        .rev()
        .find_map(|l| l.find("decision ").map(|i| &l[i..]))
        .map_or("no decision reported", |d| d.split(';').next().unwrap_or(d))
}

/// The `message_id` of the first dead message, once the DLQ mirror has it.
async fn wait_dead_message(stage: &Stage, limit: Duration) -> Result<String> {
    let started = Instant::now();
    loop {
        let id: Option<String> =
            sqlx::query_scalar("SELECT message_id FROM dlq_messages ORDER BY dead_at LIMIT 1")
                .fetch_optional(&stage.pool)
                .await?;
        if let Some(id) = id {
            return Ok(id);
        }
        if started.elapsed() > limit {
            anyhow::bail!("no message reached the DLQ within {limit:?}");
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Each engine in turn: SIGTERM, wait for its exit, start it again, while
/// the crowd buys and `health` runs against whichever engines the registry
/// holds live (docs/architecture.md §14.4, "Rolling restart"). The health
/// watch starts a moment before the first restart, so the report can set
/// the restarts against the same sale without them.
async fn rolling_restart(stage: &mut Stage, crowd: &Crowd) -> Result<Injected> {
    let users = stage.plan.users;
    let n = stage.engines.len() as u64;
    let restarting = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let watch = tokio::spawn({
        let (runner, stop, restarting) = (stage.runner(), stop.clone(), restarting.clone());
        async move {
            let mut runs: Vec<HealthRun> = Vec::new();
            while !stop.load(std::sync::atomic::Ordering::Relaxed) {
                let during = restarting.load(std::sync::atomic::Ordering::Relaxed);
                // Health's own default window (1 s), the daemon's tick: the
                // window the paging alert (`seckill_alert_state`) is judged
                // over (docs/architecture.md §11.2). A shorter one asks more
                // of a restart than anything that pages: each restart moves
                // queues twice, and rocketmq-client-rust starts a moved
                // queue's first pull 500 ms after its rebalance (§14.4).
                let (code, out) = runner.on_registry(&["health", "-o", "json"]).await?;
                runs.push(HealthRun::read(during, code, json_part(&out)));
                // One run a second: on-call's cadence, and the box's two
                // cores stay with the sale.
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            anyhow::Ok(runs)
        }
    });
    crowd.until_sent(users / (n + 2)).await;
    let (began, mut notes) = Injected::begin();
    restarting.store(true, std::sync::atomic::Ordering::Relaxed);
    let mut unmet = Vec::new();
    for i in 0..stage.engines.len() {
        // Spread over the sale: engine i goes once (i + 1) / (n + 2) of
        // the crowd has bought, so each restart lands under load.
        crowd.until_sent(users * (i as u64 + 1) / (n + 2)).await;
        let started = Instant::now();
        let Some((pid, clean)) = stage.stop_engine(i, Duration::from_secs(30)).await else {
            continue;
        };
        let stopped_s = started.elapsed().as_secs_f64();
        if !clean {
            unmet.push(format!(
                "engine {i} (pid {pid}) did not exit within 30 s of SIGTERM"
            ));
        }
        stage.start_engine(i).await?;
        notes.push(format!(
            "engine {i} (pid {pid}): SIGTERM, exited after {stopped_s:.1} s, ready again after {:.1} s",
            started.elapsed().as_secs_f64()
        ));
    }
    // One more health run after the last restart is ready.
    tokio::time::sleep(Duration::from_secs(2)).await;
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    let runs = watch.await.context("the health watch")??;
    let (said, failed) = judge_restart(&runs);
    notes.extend(said);
    unmet.extend(failed);
    Ok(Injected {
        unmet,
        ..Injected::killed(Injected::healed_now(began, notes))
    })
}

/// One `health --output json` of the rolling-restart drill.
#[derive(Debug, Clone, PartialEq)]
struct HealthRun {
    /// Taken while a restart was under way (else: before the first).
    during: bool,
    code: i32,
    /// Rows DOWN, and critical alerts other than the consumer lag.
    broken: Vec<String>,
    /// The worst group's lag, when the alert had data.
    lag_s: Option<f64>,
    lag_critical: bool,
}

impl HealthRun {
    fn read(during: bool, code: i32, json: &str) -> Self {
        let v: serde_json::Value = serde_json::from_str(json).unwrap_or_default();
        let rows = v["components"].as_array().into_iter().flatten();
        let alerts: Vec<&serde_json::Value> =
            v["alerts"].as_array().into_iter().flatten().collect();
        let lag = alerts
            .iter()
            .find(|a| a["metric"] == "mq_consumer_lag_seconds");
        let mut broken: Vec<String> = rows
            .filter(|c| c["state"] == "DOWN")
            .map(|c| {
                format!(
                    "{} DOWN: {}",
                    c["component"].as_str().unwrap_or("?"),
                    c["detail"].as_str().unwrap_or("")
                )
            })
            .collect();
        broken.extend(
            alerts
                .iter()
                .filter(|a| a["state"] == "CRITICAL" && a["metric"] != "mq_consumer_lag_seconds")
                .map(|a| {
                    format!(
                        "alert {} CRITICAL ({})",
                        a["metric"].as_str().unwrap_or("?"),
                        a["shown"].as_str().unwrap_or("?")
                    )
                }),
        );
        if v.is_null() {
            broken.push(format!("unreadable health output: {json:.200}"));
        }
        HealthRun {
            during,
            code,
            broken,
            lag_s: lag.and_then(|a| a["value"].as_f64()),
            lag_critical: lag.is_some_and(|a| a["state"] == "CRITICAL"),
        }
    }
}

/// The rolling restart's health verdict: its notes, and what failed. A
/// restart done one daemon at a time must leave no component down, no
/// daemon unreachable (exit 3) and no critical alert, the consumer lag's
/// included. The lag is measured from the daemons' own queue positions
/// (docs/architecture.md §10.4) and alerts on what held across the health
/// window (§11.2), so what a move costs is the real wait of the moved
/// queues: the new owner pulls 500 ms after the rebalance. Only a sale
/// whose lag was critical before the first restart excuses it during
/// them: then the restarts are not what made it so.
fn judge_restart(runs: &[HealthRun]) -> (Vec<String>, Vec<String>) {
    let (before, during): (Vec<&HealthRun>, Vec<&HealthRun>) = runs.iter().partition(|r| !r.during);
    let peak = |rs: &[&HealthRun]| {
        rs.iter()
            .filter_map(|r| r.lag_s)
            .fold(None, |m: Option<f64>, l| Some(m.map_or(l, |m| m.max(l))))
    };
    let secs = |v: Option<f64>| v.map_or("-".to_owned(), |v| format!("{v:.1} s"));
    let codes: Vec<i32> = during.iter().map(|r| r.code).collect();
    let lag_critical = during.iter().filter(|r| r.lag_critical).count();
    let mut notes = vec![format!(
        "{} health runs during the restarts, exit codes {codes:?}; worst consumer lag {} (before the restarts: {} over {} runs); lag alert critical in {lag_critical} of them",
        during.len(),
        secs(peak(&during)),
        secs(peak(&before)),
        before.len()
    )];
    let mut failed = Vec::new();
    if during.is_empty() {
        failed.push("no health run finished during the restarts".to_owned());
    }
    for r in &during {
        if r.code == 3 {
            failed.push(format!(
                "health exited 3 (unreachable) during the rolling restart: {}",
                r.broken.join("; ")
            ));
        } else if !r.broken.is_empty() {
            failed.push(format!(
                "health exited {} during the rolling restart: {}",
                r.code,
                r.broken.join("; ")
            ));
        }
    }
    let critical_before = before.iter().any(|r| r.lag_critical);
    if lag_critical > 0 && critical_before {
        notes.push(
            "the consumer lag was critical before the first restart too: the sale, not the restarts, made it so".to_owned(),
        );
    } else if lag_critical > 0 {
        failed.push(format!(
            "the consumer-lag alert went critical in {lag_critical} health runs during the restarts (worst {}), never before them",
            secs(peak(&during))
        ));
    }
    (notes, failed)
}

/// Once the first dead message is mirrored, kill -9 of the engine holding
/// the dlq-mirror lease; the survivor must take it within the lease TTL
/// (docs/architecture.md §14.4).
async fn singleton_takeover(stage: &mut Stage) -> Result<Injected> {
    wait_dead_message(stage, Duration::from_secs(150)).await?;
    let (began, mut notes) = Injected::begin();
    let holder = mirror_holder(stage)
        .await?
        .context("nobody holds the dlq-mirror lease, yet a dead message was mirrored")?;
    let i = stage.engine_with_id(&holder).await?.with_context(|| {
        format!("the dlq-mirror holder {holder} is none of the drill's engines")
    })?;
    let mirrored: i64 = sqlx::query_scalar("SELECT count(*) FROM dlq_messages")
        .fetch_one(&stage.pool)
        .await?;
    let pid = stage.kill_engine(i).await.unwrap_or(0);
    let killed = Instant::now();
    notes.push(format!(
        "engine {i} (pid {pid}, {holder}) held the dlq-mirror lease; killed with {mirrored} of {} dead messages mirrored",
        TAKEOVER_POISON.len()
    ));
    let ttl = Duration::from_millis(stage.cfg.registry.lease_ttl_ms);
    let limit = ttl + Duration::from_secs(5);
    let mut unmet = Vec::new();
    loop {
        match mirror_holder(stage).await? {
            Some(h) if h != holder => {
                notes.push(format!(
                    "{h} took the dlq-mirror lease {:.1} s after the kill (lease TTL {:.0} s)",
                    killed.elapsed().as_secs_f64(),
                    ttl.as_secs_f64()
                ));
                break;
            }
            _ if killed.elapsed() > limit => {
                unmet.push(format!(
                    "no live engine took the dlq-mirror lease within {limit:?} of its holder's death"
                ));
                break;
            }
            _ => tokio::time::sleep(Duration::from_millis(100)).await,
        }
    }
    Ok(Injected {
        dead: TAKEOVER_POISON.len() as u64,
        unmet,
        ..Injected::killed(Injected::healed_now(began, notes))
    })
}

/// The dlq-mirror lease's holder while it is unexpired.
async fn mirror_holder(stage: &Stage) -> Result<Option<String>> {
    Ok(sqlx::query_scalar(
        "SELECT holder FROM singleton_leases WHERE role = 'dlq-mirror' AND expires_at >= now()",
    )
    .fetch_optional(&stage.pool)
    .await?)
}

/// Every refused order reached the DLQ, and every message of the broker's
/// DLQ was mirrored exactly once, by whichever daemon held the mirror then.
async fn mirrored_once(stage: &Stage, injected: &mut Injected) -> Result<()> {
    let poisoned: Vec<String> = TAKEOVER_POISON.iter().map(i64::to_string).collect();
    let started = Instant::now();
    // The refused users' messages, mirrored (their bodies name the user).
    let users = || async {
        sqlx::query_scalar::<_, i64>(
            "SELECT count(DISTINCT convert_from(body, 'UTF8')::jsonb ->> 'user_id')
             FROM dlq_messages WHERE convert_from(body, 'UTF8')::jsonb ->> 'user_id' = ANY($1)",
        )
        .bind(&poisoned)
        .fetch_one(&stage.pool)
        .await
    };
    while users().await? < poisoned.len() as i64 && started.elapsed() < Duration::from_secs(150) {
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // Then every dead message of the broker's DLQ has its row: batch-mates
    // of a refused order may die beside it (their effect applied all the
    // same), and one message may be stored twice (dead-lettered again after
    // its consumer was killed before its offset was committed): one dead
    // message, one row.
    let (copies, dead, rows) = loop {
        let (copies, dead) = stage.dead_in_dlq(TopicKind::OrderCreate).await?;
        let rows: i64 = sqlx::query_scalar("SELECT count(*) FROM dlq_messages")
            .fetch_one(&stage.pool)
            .await?;
        if rows >= dead.len() as i64 || started.elapsed() > Duration::from_secs(170) {
            break (copies, dead, rows);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    let mirrored: Vec<String> = sqlx::query_scalar("SELECT message_id FROM dlq_messages")
        .fetch_all(&stage.pool)
        .await?;
    let missing = dead.iter().filter(|id| !mirrored.contains(id)).count();
    let stray = mirrored.iter().filter(|id| !dead.contains(*id)).count();
    let refused = users().await?;
    injected.notes.push(format!(
        "{} dead message(s) in the broker's DLQ ({copies} stored copies), {rows} mirrored; {refused} of {} refused users among them",
        dead.len(),
        poisoned.len()
    ));
    if refused != poisoned.len() as i64 {
        injected.unmet.push(format!(
            "{refused} of the {} refused users' messages reached the mirror",
            poisoned.len()
        ));
    }
    if missing > 0 || stray > 0 || rows != dead.len() as i64 {
        injected.unmet.push(format!(
            "each dead message mirrored once: {} dead in the broker's DLQ, {rows} row(s), {missing} not mirrored, {stray} mirrored that the DLQ does not hold",
            dead.len()
        ));
    }
    Ok(())
}

/// Row #7 of docs/architecture.md §13.5: the drill only proves something if some reservations
/// did expire in the frozen backlog.
async fn expired_check(stage: &Stage, f: &mut Figures) -> Result<()> {
    let expired: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM reservations WHERE activity_id = $1 AND outcome = 'REJECTED_EXPIRED'",
    )
    .bind(stage.activity)
    .fetch_one(&stage.pool)
    .await?;
    f.notes
        .push(format!("{expired} reservation(s) expired in the backlog"));
    if expired == 0 {
        f.unmet.push(
            "no reservation expired in the frozen backlog: the drill proved nothing".to_owned(),
        );
    }
    Ok(())
}

/// Row #8 of docs/architecture.md §13.5: two replays, one effect.
async fn one_order_for_poison_user(stage: &Stage, f: &mut Figures) -> Result<()> {
    let orders: i64 =
        sqlx::query_scalar("SELECT count(*) FROM orders WHERE activity_id = $1 AND user_id = $2")
            .bind(stage.activity)
            .bind(POISON_USER)
            .fetch_one(&stage.pool)
            .await?;
    f.notes
        .push(format!("user {POISON_USER} has {orders} order(s)"));
    if orders != 1 {
        f.unmet.push(format!(
            "the replayed user has {orders} orders; two replays must make exactly one"
        ));
    }
    Ok(())
}

async fn wait_decided(stage: &Stage, n: i64, limit: Duration) -> Result<i64> {
    let started = Instant::now();
    loop {
        let p = facts::progress(&stage.pool, &stage.store, stage.activity).await?;
        if p.decided >= n || started.elapsed() > limit {
            return Ok(p.decided);
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

async fn figures(
    stage: &Stage,
    injected: &Injected,
    accepted: u64,
    unanswered: u64,
    recovery_s: Option<f64>,
) -> Result<Figures> {
    let p = facts::progress(&stage.pool, &stage.store, stage.activity).await?;
    let (stored, _) = stage.stored(TopicKind::OrderCreate).await?;
    // Dead messages, not stored copies: the broker may dead-letter one
    // message twice when its consumer dies between the send-back and the
    // offset commit; it is one dead message (one mirror row, one replay).
    let dlq = stage.dead_in_dlq(TopicKind::OrderCreate).await?.1.len() as i64;
    // Reservations made while the fault lasted, or up to one send timeout
    // before it (in flight when it began).
    let since =
        injected.began - chrono::Duration::milliseconds(stage.cfg.mq.send_timeout_ms as i64);
    let affected: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM reservations WHERE activity_id = $1 AND reserved_at BETWEEN $2 AND $3",
    )
    .bind(stage.activity)
    .bind(since)
    .bind(injected.healed_wall)
    .fetch_one(&stage.pool)
    .await?;
    let duplicates = (stored - p.decided - injected.dead as i64).max(0);
    let dlq_applied = if dlq > 0 {
        dead_but_applied(stage, dlq).await?
    } else {
        0
    };
    // Send attempts (publisher and scanner, every outcome) from the
    // engines' counters, when none of them died with its counters.
    let attempts = if injected.engine_killed {
        None
    } else {
        Some(
            stage
                .stats()
                .await
                .iter()
                .map(|s| s.publish_confirmed + s.publish_unknown + s.publish_definite_failure)
                .sum::<u64>() as i64,
        )
    };
    // Unaffected reservations were sent once each; the rest of the sends
    // went to the affected ones.
    let sends = attempts.unwrap_or(stored);
    let sends_per_affected =
        (affected > 0).then(|| (sends - (p.decided - affected)) as f64 / affected as f64);
    Ok(Figures {
        accepted,
        unanswered,
        decided: p.decided,
        recovery_s,
        stored_sends: stored,
        send_attempts: attempts,
        affected,
        sends_per_affected,
        duplicates_absorbed: duplicates,
        dlq,
        dlq_applied,
        violated: stage.violated().await?,
        notes: injected.notes.clone(),
        unmet: injected.unmet.clone(),
    })
}

#[cfg(test)]
mod restart_tests {
    use super::*;

    fn run(during: bool, code: i32, lag: f64, broken: &[&str]) -> HealthRun {
        HealthRun {
            during,
            code,
            broken: broken.iter().map(|b| (*b).to_owned()).collect(),
            lag_s: Some(lag),
            lag_critical: lag > 2.5,
        }
    }

    #[test]
    fn a_restart_fails_on_a_down_row_or_any_critical_alert() {
        let calm = [
            run(false, 1, 1.4, &[]),
            run(true, 1, 2.0, &[]),
            run(true, 1, 2.4, &[]),
        ];
        let (notes, failed) = judge_restart(&calm);
        assert!(failed.is_empty(), "{failed:?}");
        assert!(
            notes[0].contains("worst consumer lag 2.4 s (before the restarts: 1.4 s"),
            "{notes:?}"
        );

        // The lag goes critical only during the restarts: they did it.
        let moved = [run(false, 1, 1.4, &[]), run(true, 2, 3.1, &[])];
        let (notes, failed) = judge_restart(&moved);
        assert!(notes[0].contains("critical in 1"), "{notes:?}");
        assert_eq!(failed.len(), 1, "{failed:?}");
        assert!(failed[0].contains("consumer-lag"), "{failed:?}");
        // It was critical before them too: the sale did it.
        let loaded = [run(false, 2, 2.8, &[]), run(true, 2, 3.1, &[])];
        assert!(judge_restart(&loaded).1.is_empty());

        let down = [run(true, 3, 1.0, &["engine DOWN: no engine answers"])];
        let (_, failed) = judge_restart(&down);
        assert_eq!(failed.len(), 1);
        assert!(failed[0].contains("unreachable"), "{failed:?}");

        let tx = [run(
            true,
            2,
            1.0,
            &["alert order_tx_latency_seconds_p99 CRITICAL (1.2 s)"],
        )];
        assert_eq!(judge_restart(&tx).1.len(), 1);

        // Runs only before the restarts prove nothing.
        assert_eq!(judge_restart(&[run(false, 0, 0.2, &[])]).1.len(), 1);
    }

    #[test]
    fn health_output_is_read_into_its_parts() {
        let json = r#"{"components":[{"component":"engine e1","state":"UP"},{"component":"redis","state":"DOWN","detail":"refused"}],
            "alerts":[{"metric":"mq_consumer_lag_seconds","state":"CRITICAL","value":2.9,"shown":"2.9 s"},
                      {"metric":"pg_pool_wait_seconds_p95","state":"CRITICAL","shown":"120 ms"}]}"#;
        let r = HealthRun::read(true, 3, json);
        assert_eq!(r.lag_s, Some(2.9));
        assert!(r.lag_critical);
        assert_eq!(r.broken.len(), 2, "{:?}", r.broken);
        assert!(HealthRun::read(true, 3, "not json").broken[0].contains("unreadable"));
    }
}
