//! `seckillctl backlog`, `pending`, `pg` and `scale advise` (docs/architecture.md §10):
//! read-only views over two samples a window apart, so every rate is a
//! measured difference. The numbers come from the engine's observer,
//! the same functions the daemon and the TUI use.

use crate::output::{OutputFormat, Tabular, new_table, render};
use anyhow::Result;
use seckill_engine::{
    Advice, BacklogRow, ClientRuntime, Config, Drain, EngineRow, Level, Observation, Observer,
    PendingRow, PgView, PoolRow, RATE_SPAN, ScaleInputs, Seen, ServerRow, Singleton, Source,
    SourceError, Watch,
};
use serde::Serialize;
use std::io::Write;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, Clone, clap::Args)]
pub struct WindowArgs {
    /// Time between the two samples rates are computed from
    #[arg(long, value_parser = crate::parse::duration, default_value = "1s")]
    window: Duration,
    #[arg(long, short, value_enum, default_value_t)]
    output: OutputFormat,
}

/// `--by-engine`: one line per engine daemon under the table. The JSON
/// always carries them (`engines`), and a dead or unreachable daemon is
/// always listed: it is a finding (docs/architecture.md §14.3).
#[derive(Debug, Clone, Copy, clap::Args)]
pub struct ByEngine {
    /// Also list each engine daemon's part (always in the JSON)
    #[arg(long)]
    by_engine: bool,
}

/// One engine's line: what it carries, or why it is missing.
pub fn engine_line(e: &EngineRow) -> String {
    let name = e.id.as_deref().unwrap_or(&e.url);
    let roles = if e.roles.is_empty() {
        String::new()
    } else {
        format!(" [{}]", Singleton::cell(&e.roles, ", "))
    };
    let ago =
        |ms: Option<i64>| ms.map_or("?".into(), |ms| format!("{:.1} s ago", ms as f64 / 1000.0));
    match e.seen {
        Seen::Answered => format!(
            "engine {name} ({}) live: inflight {}, orders {}, pool {}/{}, pool wait p95 {:.1} ms, order tx p99 {:.1} ms, circuit {}, admission {}{roles}",
            e.url,
            e.inflight.unwrap_or(0),
            e.orders_created.unwrap_or(0),
            e.pool_in_use.unwrap_or(0),
            e.pool_max.unwrap_or(0),
            e.pool_wait_p95_ms.unwrap_or(0.0),
            e.order_tx_p99_ms.unwrap_or(0.0),
            e.send_circuit.as_deref().unwrap_or("-"),
            if e.admitting.unwrap_or(true) {
                "open"
            } else {
                "CLOSED"
            },
        ),
        Seen::Unreachable => format!(
            "engine {name} UNREACHABLE: {}{roles}",
            e.error.as_deref().unwrap_or("no answer")
        ),
        Seen::Silent => format!(
            "engine {name} ({}) DEAD, silent since {}: runbooks/engine-dead.md{roles}",
            e.url,
            ago(e.heartbeat_age_ms)
        ),
        Seen::Stopped => format!("engine {name} ({}) stopped cleanly", e.url),
    }
}

/// The lines for `engines`: every one with `all`, else the findings only
/// (dead or unreachable daemons while others answer).
pub fn engine_lines(engines: &[EngineRow], all: bool) -> Vec<String> {
    engines
        .iter()
        .filter(|e| all || matches!(e.seen, Seen::Silent | Seen::Unreachable))
        // With no engine answering, the sample's own error says so once.
        .filter(|e| {
            all || e.seen != Seen::Unreachable || engines.iter().any(|o| o.seen == Seen::Answered)
        })
        .map(engine_line)
        .collect()
}

/// Like [`WindowArgs`], for consumer rates: the broker learns consumed
/// offsets once a second, so a shorter window misreads them.
#[derive(Debug, Clone, clap::Args)]
pub struct RateWindowArgs {
    /// Time between the two samples rates are computed from (at least 2s is sound)
    #[arg(long, value_parser = crate::parse::duration, default_value = "3s")]
    window: Duration,
    #[arg(long, short, value_enum, default_value_t)]
    output: OutputFormat,
}

#[derive(Debug, clap::Args)]
pub struct BacklogArgs {
    /// Only this consumer group (full name or a case-insensitive part of it)
    #[arg(long)]
    group: Option<String>,
    /// Refresh in place until Ctrl-C (JSON: one line per refresh)
    #[arg(long)]
    watch: bool,
    /// How often --watch redraws
    #[arg(long, value_parser = crate::parse::duration, default_value = "1s")]
    every: Duration,
    /// Also list each group's lag broker by broker (always in the JSON)
    #[arg(long)]
    by_broker: bool,
    #[command(flatten)]
    e: ByEngine,
    #[command(flatten)]
    w: RateWindowArgs,
}

#[derive(Debug, clap::Subcommand)]
pub enum ScaleCmd {
    /// The docs/architecture.md §10.8 decision, from measured lag, PostgreSQL and expiry
    Advise(ScaleArgs),
}

#[derive(Debug, clap::Args)]
pub struct ScaleArgs {
    /// Order transactions PostgreSQL sustains (a load-test figure) [default: governor.safe_pg_concurrency, else pg.max_connections]
    #[arg(long)]
    safe_pg_concurrency: Option<u32>,
    /// Share of that left to order creation [default: consumer.pg_share]
    #[arg(long)]
    order_share: Option<f64>,
    /// Engine instances sharing the budget [default: the registry's live engines, else governor.instances]
    #[arg(long)]
    instances: Option<u32>,
    #[command(flatten)]
    e: ByEngine,
    #[command(flatten)]
    w: RateWindowArgs,
}

#[derive(Debug, clap::Args)]
pub struct PgArgs {
    #[command(flatten)]
    e: ByEngine,
    #[command(flatten)]
    w: WindowArgs,
}

/// One observation with rates over `window` (two samples that far apart).
async fn observe(cfg: &Config, rt: Arc<ClientRuntime>, window: Duration) -> Observation {
    let mut watch = Watch::new(Observer::new(cfg, rt));
    let o = watch.over(window).await;
    watch.shutdown().await;
    o
}

fn secs(v: Option<f64>) -> String {
    v.map_or("-".into(), |s| format!("{s:.1} s"))
}

fn per_s(v: Option<f64>) -> String {
    v.map_or("-".into(), |r| format!("{r:.0}/s"))
}

fn level(l: Level) -> String {
    format!("{l:?}").to_uppercase()
}

fn error_lines(errors: &[SourceError]) -> Vec<String> {
    errors
        .iter()
        .map(|e| format!("{} unreadable: {}", e.source, e.error))
        .collect()
}

#[derive(Debug, Serialize)]
pub struct BacklogReport {
    pub at_ms: i64,
    pub groups: Vec<BacklogRow>,
    /// Each engine daemon: its in-flight part and state.
    pub engines: Vec<EngineRow>,
    pub errors: Vec<SourceError>,
    /// `--by-broker`: the table lists each group's brokers too.
    #[serde(skip)]
    pub by_broker: bool,
    #[serde(skip)]
    pub by_engine: bool,
}

impl Tabular for BacklogReport {
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table([
            "GROUP",
            "LAG MSGS",
            "LAG",
            "RETRY",
            "INFLIGHT",
            "CONSUME",
            "PRODUCE",
            "DRAIN ETA",
            "TO EXPIRY",
            "VERDICT",
        ]);
        for r in &self.groups {
            t.add_row([
                r.group.clone(),
                r.lag_messages.to_string(),
                format!("{:.1} s", r.lag_seconds),
                r.retry_lag_messages.to_string(),
                r.inflight.map_or("-".into(), |i| i.to_string()),
                per_s(r.consume_per_s),
                per_s(r.produce_per_s),
                match r.drain {
                    None => "-".into(),
                    Some(Drain::Empty) => "empty".into(),
                    Some(Drain::In(s)) => format!("{s:.1} s"),
                    Some(Drain::Never) => "never".into(),
                },
                secs(r.seconds_to_oldest_expiry),
                level(r.verdict),
            ]);
        }
        t
    }

    fn footer(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if self.by_broker {
            // One line per (group, broker): the brokers' parts add up to the
            // group's lag, and the longest wait is the group's.
            for r in &self.groups {
                for b in &r.per_broker {
                    lines.push(format!(
                        "{} on {}: {} msgs, {:.1} s",
                        r.group, b.broker, b.messages, b.seconds
                    ));
                }
            }
        }
        lines.extend(engine_lines(&self.engines, self.by_engine));
        lines.extend(error_lines(&self.errors));
        if self.groups.iter().any(|r| r.verdict != Level::Ok) {
            lines.push("lag over threshold: runbooks/consumer-lag.md; `seckillctl scale advise` for the lever".into());
        }
        lines
    }
}

fn backlog_report(args: &BacklogArgs, o: &Observation) -> BacklogReport {
    let needle = args.group.as_deref().map(str::to_lowercase);
    BacklogReport {
        at_ms: o.sample.at_ms,
        groups: o
            .backlog
            .iter()
            .filter(|r| {
                needle
                    .as_deref()
                    .is_none_or(|n| r.group.to_lowercase().contains(n))
            })
            .cloned()
            .collect(),
        engines: o.engines.clone(),
        errors: o.sample.errors.clone(),
        by_broker: args.by_broker,
        by_engine: args.e.by_engine,
    }
}

pub async fn backlog(args: BacklogArgs, cfg: &Config, rt: Arc<ClientRuntime>) -> Result<()> {
    let mut watch = Watch::new(Observer::new(cfg, rt));
    let mut o = watch.over(args.w.window).await;
    loop {
        let report = backlog_report(&args, &o);
        if args.group.is_some() && report.groups.is_empty() && report.errors.is_empty() {
            watch.shutdown().await;
            anyhow::bail!(crate::exit::UsageError(format!(
                "no consumer group matches {:?}; `seckillctl backlog` lists them",
                args.group.as_deref().unwrap_or_default()
            )));
        }
        let mut out = std::io::stdout().lock();
        match (args.watch, args.w.output) {
            (false, f) => render(&mut out, f, &report)?,
            (true, OutputFormat::Json) => {
                serde_json::to_writer(&mut out, &report)?;
                writeln!(out)?;
            }
            (true, OutputFormat::Table) => {
                // Clear and home, then redraw: refresh in place.
                write!(out, "\x1b[2J\x1b[H")?;
                writeln!(
                    out,
                    "seckillctl backlog --watch  (every {:?}, rates over ≥{:?}; Ctrl-C to stop)",
                    args.every, RATE_SPAN
                )?;
                render(&mut out, OutputFormat::Table, &report)?;
            }
        }
        out.flush()?;
        drop(out);
        if !args.watch {
            break;
        }
        tokio::select! {
            _ = tokio::signal::ctrl_c() => break,
            _ = tokio::time::sleep(args.every) => {}
        }
        o = watch.next().await;
    }
    watch.shutdown().await;
    Ok(())
}

#[derive(Debug, Serialize)]
pub struct PendingReport {
    pub activities: Vec<PendingRow>,
    pub errors: Vec<SourceError>,
}

impl Tabular for PendingReport {
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table([
            "ACTIVITY",
            "PENDING",
            "OLDEST AGE",
            "NEXT RETRY",
            "TO EXPIRY",
            "EXPIRING",
            "SEND ATTEMPTS (attempt:count)",
            "VERDICT",
        ]);
        for r in &self.activities {
            let hist: Vec<String> = r.attempts.iter().map(|(a, n)| format!("{a}:{n}")).collect();
            t.add_row([
                r.activity_id.to_string(),
                format!(
                    "{}{}",
                    r.count,
                    if r.truncated { " (oldest sampled)" } else { "" }
                ),
                secs(r.oldest_age_s),
                r.next_due_in_s.map_or("-".into(), |s| {
                    if s < 0.0 {
                        format!("overdue {:.1} s", -s)
                    } else {
                        format!("in {s:.1} s")
                    }
                }),
                secs(r.seconds_to_oldest_expiry),
                r.expiring.to_string(),
                if hist.is_empty() {
                    "-".into()
                } else {
                    hist.join(" ")
                },
                level(r.verdict),
            ]);
        }
        t
    }

    fn footer(&self) -> Vec<String> {
        let mut lines = error_lines(&self.errors);
        if self.activities.is_empty() && self.errors.is_empty() {
            lines.push("no activity is seeded in Redis under this prefix".into());
        }
        if self.activities.iter().any(|r| r.verdict != Level::Ok) {
            lines.push("pending too old: runbooks/pending-oldest-age.md".into());
        }
        lines
    }
}

pub async fn pending(args: WindowArgs, cfg: &Config, rt: Arc<ClientRuntime>) -> Result<()> {
    let mut watch = Watch::new(Observer::new(cfg, rt));
    let o = watch.next().await;
    watch.shutdown().await;
    let report = PendingReport {
        activities: o.pending,
        errors: o
            .sample
            .errors
            .into_iter()
            .filter(|e| e.source == Source::Redis)
            .collect(),
    };
    render(&mut std::io::stdout().lock(), args.output, &report)
}

#[derive(Debug, Serialize)]
pub struct PgReport {
    #[serde(flatten)]
    pub view: PgView,
    /// Each engine daemon's pool and order transactions (the `engine`
    /// side above adds them up; its latencies are the worst daemon's).
    pub engines: Vec<EngineRow>,
    pub errors: Vec<SourceError>,
    #[serde(skip)]
    pub by_engine: bool,
}

impl Tabular for PgReport {
    /// The engine's side (its pool, then its order transactions), then the
    /// server's (docs/architecture.md §10.11).
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table(["SIDE", "FIGURE", "VALUE"]);
        for (side, figures) in [
            ("engine", engine_figures(&self.view)),
            ("server", server_figures(self.view.server.as_ref())),
        ] {
            for (k, v) in figures {
                t.add_row([side.to_owned(), k.to_owned(), v]);
            }
        }
        t
    }

    fn footer(&self) -> Vec<String> {
        let mut lines = engine_lines(&self.engines, self.by_engine);
        lines.extend(error_lines(&self.errors));
        lines
    }
}

/// One row of the `pg` table: a figure and its value.
type Figure = (&'static str, String);

/// The engine's pool, or why it is missing, then its order tx p99.
fn engine_figures(view: &PgView) -> Vec<Figure> {
    let mut rows = match &view.pool {
        Some(p) => pool_figures(p),
        None => vec![("pool", "no engine answered (see below)".into())],
    };
    rows.push((
        "order tx p99",
        view.order_tx_p99_ms
            .map_or("-".into(), |v| format!("{v:.1} ms")),
    ));
    rows
}

fn pool_figures(p: &PoolRow) -> Vec<Figure> {
    vec![
        ("pool size / max", format!("{} / {}", p.size, p.max)),
        ("idle", p.idle.to_string()),
        ("in use", p.in_use.to_string()),
        (
            "acquire wait p95",
            format!("{:.1} ms", p.acquire_wait_p95_ms),
        ),
    ]
}

/// PostgreSQL's own activity, or one row saying it was unreadable.
fn server_figures(server: Option<&ServerRow>) -> Vec<Figure> {
    let Some(s) = server else {
        return vec![("activity", "unreadable (see below)".into())];
    };
    vec![
        (
            "connections / max",
            format!("{} / {}", s.connections, s.max_connections),
        ),
        ("active", s.active.to_string()),
        ("idle in transaction", s.idle_in_transaction.to_string()),
        ("lock waiters", s.lock_waiters.to_string()),
        (
            "WAL/IO wait share",
            format!("{:.0}%", s.io_wait_share * 100.0),
        ),
        ("commits", per_s(s.commits_per_s)),
        (
            "WAL bytes",
            s.wal_bytes_per_s
                .map_or("-".into(), |b| format!("{:.1} KiB/s", b / 1024.0)),
        ),
        ("longest transaction", format!("{:.1} s", s.longest_tx_s)),
        ("autovacuum", autovacuum(s.autovacuum)),
        (
            "dead rows (outbox, inbox, orders, reservations)",
            format!(
                "{} ({:.0}% of versions)",
                s.churn_dead_rows,
                s.churn_dead_share * 100.0
            ),
        ),
    ]
}

/// Off is spelled out with its fix: without autovacuum, dead row versions
/// pile up under every order rewrite.
fn autovacuum(on: Option<bool>) -> String {
    match on {
        Some(true) => "on".into(),
        Some(false) => "OFF: dead row versions pile up and plans go stale; \
                        ALTER SYSTEM SET autovacuum = on; SELECT pg_reload_conf()"
            .into(),
        None => "-".into(),
    }
}

pub async fn pg(args: PgArgs, cfg: &Config, rt: Arc<ClientRuntime>) -> Result<()> {
    let o = observe(cfg, rt, args.w.window).await;
    let report = PgReport {
        view: o.pg,
        engines: o.engines,
        by_engine: args.e.by_engine,
        errors: o
            .sample
            .errors
            .iter()
            .filter(|e| matches!(e.source, Source::Postgresql | Source::Engine))
            .cloned()
            .collect(),
    };
    render(&mut std::io::stdout().lock(), args.w.output, &report)
}

#[derive(Debug, Serialize)]
pub struct ScaleReport {
    pub inputs: ScaleInputs,
    pub advice: Advice,
    pub engines: Vec<EngineRow>,
    pub errors: Vec<SourceError>,
    #[serde(skip)]
    pub by_engine: bool,
}

impl Tabular for ScaleReport {
    fn table(&self) -> comfy_table::Table {
        let i = &self.inputs;
        let a = &self.advice;
        let opt_ms = |v: Option<f64>| v.map_or("unmeasured".into(), |v| format!("{v:.1} ms"));
        let mut t = new_table(["", "VALUE"]);
        for (k, v) in [
            (
                "lag (order-create)",
                format!(
                    "{:.1} s, growing {:.0}/s → {:?}",
                    i.lag_seconds, i.lag_growth_per_s, a.lag
                ),
            ),
            ("drain", format!("{:?}", i.drain)),
            ("to oldest valid_until", secs(i.seconds_to_oldest_expiry)),
            ("expiring unconsumed", i.expiring.to_string()),
            ("pool wait p95", opt_ms(i.pool_wait_p95_ms)),
            ("order tx p99", opt_ms(i.tx_p99_ms)),
            (
                "WAL/IO wait share",
                i.io_wait_share
                    .map_or("unmeasured".into(), |s| format!("{:.0}%", s * 100.0)),
            ),
            (
                "lock waiters / longest tx",
                format!(
                    "{} / {}",
                    i.lock_waiters.map_or("-".into(), |w| w.to_string()),
                    secs(i.longest_tx_s)
                ),
            ),
            (
                "broker uptime",
                i.broker_uptime_s
                    .map_or("not reported".into(), |u| format!("{u:.0} s")),
            ),
            ("PostgreSQL", format!("{:?}", a.pg)),
            ("near expiry", a.near_expiry.to_string()),
            (
                "budget (docs/architecture.md §10.7)",
                format!(
                    "{} safe x {:.0}% order share = {} ; / {} instance(s) = {} per instance (now {})",
                    i.budget.safe_pg_concurrency,
                    i.budget.order_share * 100.0,
                    a.budget.order_budget,
                    i.budget.instances,
                    a.budget.per_instance,
                    i.budget.threads_per_instance
                ),
            ),
            (
                "row (docs/architecture.md §10.8)",
                if a.row == 0 {
                    "none".into()
                } else {
                    format!("{} — {:?}", a.row, a.action)
                },
            ),
            (
                "engine pools vs max_connections",
                match a.pools {
                    None => "unmeasured".into(),
                    Some(p) if p.fits => format!(
                        "{} of {} allowed ({} max_connections): fits",
                        p.pools_max, p.allowed, p.server_max_connections
                    ),
                    Some(p) => format!(
                        "{} > {} allowed ({} max_connections): a full burst is refused connections; lower [pg] max_connections per engine or raise the server's",
                        p.pools_max, p.allowed, p.server_max_connections
                    ),
                },
            ),
            ("why", a.why.clone()),
            ("do", a.step.clone()),
        ] {
            t.add_row([k.to_owned(), v]);
        }
        t
    }

    fn footer(&self) -> Vec<String> {
        let mut lines = engine_lines(&self.engines, self.by_engine);
        lines.extend(error_lines(&self.errors));
        lines
    }
}

pub async fn scale(cmd: ScaleCmd, cfg: &Config, rt: Arc<ClientRuntime>) -> Result<()> {
    let ScaleCmd::Advise(args) = cmd;
    let mut cfg = cfg.clone();
    if let Some(v) = args.safe_pg_concurrency {
        cfg.governor.safe_pg_concurrency = Some(v);
    }
    if let Some(v) = args.order_share {
        if !(0.0..=1.0).contains(&v) {
            anyhow::bail!(crate::exit::UsageError(format!(
                "--order-share must be between 0 and 1 (e.g. 0.7 for 70%), not {v}"
            )));
        }
        cfg.consumer.pg_share = v;
    }
    if let Some(v) = args.instances {
        cfg.governor.instances = v.max(1);
    }
    let o = observe(&cfg, rt, args.w.window).await;
    let report = ScaleReport {
        advice: o.advice,
        inputs: o.scale_inputs,
        engines: o.engines,
        errors: o.sample.errors,
        by_engine: args.e.by_engine,
    };
    render(&mut std::io::stdout().lock(), args.w.output, &report)
}
