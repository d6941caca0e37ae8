//! `seckillctl`: the operator console for the flash-sale engine.
//!
//! Layout: `settings` layers the config, `cmd::*` holds one module per
//! subcommand (each returns data), `drill` runs the incident drills,
//! `parse` reads durations and rates, `access` says who the CLI acts as
//! and whether it may, `remote` sends mutations to the daemon's operator API,
//! `output` renders tables or JSON, and `exit` maps errors to exit codes in
//! one place.

mod access;
mod cmd;
mod drill;
mod exit;
mod logging;
mod output;
mod parse;
mod remote;
mod settings;

use clap::{Parser, Subcommand};

/// The daemon allocates per request and per message (HTTP bodies, JSON,
/// broker frames, bind arrays) on many threads; under a flash-sale burst
/// glibc's malloc was about a third of the engine's user CPU on two cores
/// (perf, issue 3). mimalloc's per-thread heaps cut that, and every cycle
/// saved goes to the order consumer competing for the same cores.
#[global_allocator]
static GLOBAL: mimalloc::MiMalloc = mimalloc::MiMalloc;
use exit::Exit;
use seckill_engine::runtime;
use std::process::ExitCode;

#[derive(Debug, Parser)]
#[command(
    name = "seckillctl",
    version,
    about = "Operator console for the flash-sale engine"
)]
struct Cli {
    #[command(flatten)]
    config: settings::ConfigFlags,
    /// Log filter, e.g. `info` or `seckill_engine=debug` [env RUST_LOG]
    #[arg(long, global = true, default_value = "warn")]
    log: String,
    /// Log lines as text or JSON; auto: JSON for `engine run` when stdout is not a terminal [default: [log] format, else auto]
    #[arg(long, global = true, env = "SECKILL_LOG_FORMAT", value_parser = parse_log_format)]
    log_format: Option<seckill_engine::LogFormat>,
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Schema migrations
    #[command(subcommand)]
    Db(cmd::db::DbCmd),
    /// Every component and every docs/architecture.md §11.2 alert; exit 0 ok, 1 warn, 2 critical, 3 unreachable
    Health(cmd::health::HealthArgs),
    /// Consumer lag per group: seconds, rates, drain ETA, verdict (docs/architecture.md §10)
    Backlog(cmd::observe::BacklogArgs),
    /// Pending reservations per activity: oldest age, next retry, send attempts
    Pending(cmd::observe::WindowArgs),
    /// PostgreSQL pressure: the engine's pool and the server's activity
    Pg(cmd::observe::PgArgs),
    /// Scaling advice from the docs/architecture.md §10.8 table
    #[command(subcommand)]
    Scale(cmd::observe::ScaleCmd),
    /// RocketMQ topics and consumer groups
    #[command(subcommand)]
    Mq(cmd::mq::MqCmd),
    /// Show the effective configuration (secrets redacted)
    Config(cmd::config::ConfigArgs),
    /// Activities and their stock
    #[command(subcommand)]
    Activity(cmd::activity::ActivityCmd),
    /// Dead messages and their tickets (docs/architecture.md §9)
    #[command(subcommand)]
    Dlq(cmd::dlq::DlqCmd),
    /// Malformed messages the consumers refused: list, show, discard (docs/architecture.md §7.3)
    #[command(subcommand)]
    Quarantine(cmd::quarantine::QuarantineCmd),
    /// Pay, cancel or show an order (docs/architecture.md §8)
    #[command(subcommand)]
    Order(cmd::order::OrderCmd),
    /// Check the invariants of docs/architecture.md §12; exit 5 on a violation
    Reconcile(cmd::reconcile::ReconcileArgs),
    /// One reservation's story across Redis, the broker and PostgreSQL, with a verdict
    /// (docs/architecture.md §11.6); exit 0 consistent, 1 in flight, 5 broken
    Trace(cmd::trace::TraceArgs),
    /// Benchmarks against a running engine
    #[command(subcommand)]
    Bench(cmd::bench::BenchCmd),
    /// The engine daemon
    #[command(subcommand)]
    Engine(cmd::engine::EngineCmd),
    /// Every engine daemon in the registry, live or dead (docs/architecture.md §14.3)
    Engines(cmd::engines::EnginesArgs),
    /// Bearer tokens for the engine's API (docs/security.md)
    #[command(subcommand)]
    Auth(cmd::auth::AuthCmd),
    /// The operator audit log: who changed what, before and after
    #[command(subcommand)]
    Audit(cmd::audit::AuditCmd),
    /// Incident drills against private servers: list, run NAME…|all|ci (docs/architecture.md §13.5)
    #[command(subcommand)]
    Drill(cmd::drill::DrillCmd),
    /// The live on-call screen: backlog, pending, PostgreSQL, DLQ tickets, alerts
    Tui(cmd::tui::TuiArgs),
}

fn main() -> ExitCode {
    // Usage errors exit 64 like every other bad input (exit.rs), not clap's 2.
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            return ExitCode::from(if e.use_stderr() {
                Exit::Usage.code()
            } else {
                Exit::Ok.code()
            });
        }
    };
    // The configuration first: `[log] format` shapes the logs. A broken
    // file is reported by `run`, with its exit code, after logging starts.
    let cfg = settings::load(&cli.config);
    let daemon = matches!(cli.command, Command::Engine(_));
    let config = cfg.as_ref().map_or(Default::default(), |c| c.log.format);
    let shape = logging::shape(
        cli.log_format,
        config,
        daemon,
        logging::stdout_is_terminal(),
    );
    // Log lines would tear the TUI's screen apart: it shows errors itself.
    // Spans go to a collector from the daemon only: the other commands
    // run no pipeline stage (docs/architecture.md §11.5).
    let otlp = cfg
        .as_ref()
        .ok()
        .and_then(|c| c.log.otlp_endpoint.as_deref())
        .filter(|_| daemon);
    let _telemetry = if matches!(cli.command, Command::Tui(_)) {
        logging::off();
        logging::Telemetry::default()
    } else {
        match logging::init(&cli.log, shape, otlp) {
            Ok(t) => t,
            Err(e) => {
                eprintln!("error: {e}");
                return ExitCode::from(Exit::Usage.code());
            }
        }
    };
    let code = match run(cli, cfg, shape) {
        Ok(code) => code,
        Err(err) => {
            eprintln!("error: {err:#}");
            Exit::for_error(&err)
        }
    };
    ExitCode::from(code.code())
}

fn parse_log_format(s: &str) -> Result<seckill_engine::LogFormat, String> {
    s.parse()
}

fn run(
    cli: Cli,
    cfg: anyhow::Result<seckill_engine::Config>,
    shape: logging::Shape,
) -> anyhow::Result<Exit> {
    let cfg = cfg.map_err(|e| anyhow::Error::new(exit::UsageError(format!("{e:#}"))))?;
    // The RocketMQ client never builds its own runtime (ROCKETMQ.md): the
    // binary owns it, and everything else (sqlx, redis, axum) shares it.
    runtime::run(|rt| async move {
        match cli.command {
            Command::Db(c) => cmd::db::run(c, &cfg).await.map(|()| Exit::Ok),
            Command::Health(a) => cmd::health::run(a, &cfg, rt).await,
            Command::Backlog(a) => cmd::observe::backlog(a, &cfg, rt).await.map(|()| Exit::Ok),
            Command::Pending(a) => cmd::observe::pending(a, &cfg, rt).await.map(|()| Exit::Ok),
            Command::Pg(a) => cmd::observe::pg(a, &cfg, rt).await.map(|()| Exit::Ok),
            Command::Scale(c) => cmd::observe::scale(c, &cfg, rt).await.map(|()| Exit::Ok),
            Command::Mq(c) => cmd::mq::run(c, &cfg, rt).await.map(|()| Exit::Ok),
            Command::Config(a) => cmd::config::run(a, &cfg).map(|()| Exit::Ok),
            Command::Activity(c) => cmd::activity::run(c, &cfg, rt).await.map(|()| Exit::Ok),
            Command::Dlq(c) => cmd::dlq::run(c, &cfg, rt).await,
            Command::Order(c) => cmd::order::run(c, &cfg).await,
            Command::Quarantine(c) => cmd::quarantine::run(c, &cfg).await.map(|()| Exit::Ok),
            Command::Reconcile(a) => cmd::reconcile::run(a, &cfg).await,
            Command::Trace(a) => cmd::trace::run(a, &cfg, rt).await,
            Command::Bench(c) => cmd::bench::run(c, &cfg, rt).await.map(|()| Exit::Ok),
            Command::Engine(c) => cmd::engine::run(c, &cfg, rt, shape)
                .await
                .map(|()| Exit::Ok),
            Command::Auth(c) => cmd::auth::run(c, &cfg).await.map(|()| Exit::Ok),
            Command::Audit(c) => cmd::audit::run(c, &cfg).await.map(|()| Exit::Ok),
            Command::Engines(a) => cmd::engines::run(a, &cfg).await.map(|()| Exit::Ok),
            Command::Drill(c) => cmd::drill::run(c, &cfg, rt).await,
            Command::Tui(a) => cmd::tui::run(a, &cfg, rt).await.map(|()| Exit::Ok),
        }
    })?
}
