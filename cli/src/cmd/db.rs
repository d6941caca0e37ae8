//! `seckillctl db migrate|status|prune`.

use crate::exit::UsageError;
use crate::output::{OutputFormat, Tabular, new_table, render};
use anyhow::{Result, bail};
use seckill_engine::{
    CancellationToken, Config, MigrationRow, PruneReport, PruneRequest, PruneTable, RetentionError,
    RetentionRefusal, RunBy, audit, db, retention,
};
use serde::Serialize;
use std::time::Duration;

#[derive(Debug, clap::Subcommand)]
pub enum DbCmd {
    /// Apply every pending migration
    Migrate,
    /// List applied and pending migrations
    Status {
        #[arg(long, short, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// Delete the finished history older than --older-than: SUCCEEDED and
    /// REJECTED inbox rows, SENT outbox rows, consumer failures (docs/architecture.md §16.2)
    Prune(PruneArgs),
}

#[derive(Debug, clap::Args)]
pub struct PruneArgs {
    /// Delete rows older than this, e.g. 14d or 336h; at least [dlq] broker_retention_hours (72h)
    #[arg(long, value_parser = parse_age)]
    older_than: Duration,
    /// Only this table [default: all three]
    #[arg(long, value_parser = parse_table)]
    table: Option<PruneTable>,
    /// Rows deleted per transaction
    #[arg(long, default_value_t = retention::DEFAULT_BATCH)]
    batch: i64,
    /// Count what would be deleted; write and delete nothing
    #[arg(long)]
    dry_run: bool,
    /// Why (kept in operator_audit)
    #[arg(long)]
    reason: Option<String>,
    #[arg(long, short, value_enum, default_value_t)]
    output: OutputFormat,
}

/// `14d`, `336h`, `90m`: days on top of [`crate::parse::duration`]'s units,
/// since retention is counted in days.
fn parse_age(s: &str) -> Result<Duration, String> {
    let bad = || format!("invalid age {s:?}: expected e.g. 14d or 336h");
    match s.strip_suffix('d') {
        Some(days) => days
            .parse::<u64>()
            .ok()
            .and_then(|d| d.checked_mul(86_400))
            .map(Duration::from_secs)
            .ok_or_else(bad),
        None => crate::parse::duration(s).map_err(|e| format!("{e}; or days, e.g. 14d")),
    }
}

fn parse_table(s: &str) -> Result<PruneTable, String> {
    s.parse().map_err(|e| format!("{e}"))
}

/// The answer of `db prune`, for a table or `--output json`.
#[derive(Debug, Serialize)]
#[serde(transparent)]
struct PruneView(PruneReport);

impl Tabular for PruneView {
    fn table(&self) -> comfy_table::Table {
        let rows = if self.0.dry_run {
            "WOULD DELETE"
        } else {
            "DELETED"
        };
        let mut t = new_table(["TABLE", rows, "BATCHES", "HORIZON", "MARK", "DONE"]);
        let at = |d: &chrono::DateTime<chrono::Utc>| d.format("%Y-%m-%d %H:%M:%S UTC").to_string();
        for r in &self.0.tables {
            t.add_row([
                r.relation.clone(),
                r.rows.to_string(),
                r.batches.to_string(),
                at(&r.horizon),
                r.mark.as_ref().map(at).unwrap_or_else(|| "-".into()),
                if r.finished { "yes" } else { "no" }.to_owned(),
            ]);
        }
        t
    }

    fn footer(&self) -> Vec<String> {
        let r = &self.0;
        if r.dry_run {
            vec![format!(
                "dry run: nothing deleted; {} row(s) older than {} h would go",
                r.deleted(),
                r.keep_hours
            )]
        } else if r.stopped {
            vec![format!(
                "stopped between batches after {} row(s); run it again to finish",
                r.deleted()
            )]
        } else {
            vec![format!(
                "deleted {} row(s) older than {} h",
                r.deleted(),
                r.keep_hours
            )]
        }
    }
}

/// Bad input exits 64 with the flag to fix (exit.rs).
fn refusal(e: &RetentionRefusal, older_than: Duration, batch: i64) -> UsageError {
    match e {
        RetentionRefusal::BadBatch(_) => UsageError(format!("--batch {batch}: {e}")),
        _ => UsageError(format!(
            "--older-than {}h: {e}",
            older_than.as_secs() / 3600
        )),
    }
}

async fn prune(a: PruneArgs, cfg: &Config) -> Result<()> {
    let req = PruneRequest {
        keep: a.older_than,
        floor: cfg.dlq.broker_retention(),
        tables: a
            .table
            .map_or_else(|| PruneTable::ALL.to_vec(), |t| vec![t]),
        batch: a.batch,
        dry_run: a.dry_run,
    };
    // Everything the user can fix is refused before anything is touched.
    match retention::check(&req) {
        Err(RetentionError::Refused(e)) => {
            return Err(refusal(&e, a.older_than, a.batch).into());
        }
        Err(e) => return Err(UsageError(e.to_string()).into()),
        Ok(()) => {}
    }
    let Some(reason) = a.reason.filter(|r| !r.trim().is_empty()) else {
        return Err(UsageError(
            "--reason is required: say why this prune is safe (it is kept in operator_audit)"
                .into(),
        )
        .into());
    };
    if !a.dry_run {
        crate::access::writable(cfg, "db prune")?;
    }
    let pool = db::connect(cfg).await?;
    // The first Ctrl-C stops between batches: what is deleted stays
    // deleted, the table is not stamped done (docs/architecture.md §16.2).
    let cancel = CancellationToken::new();
    let on_signal = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            eprintln!("stopping after this batch");
            on_signal.cancel();
        }
    });
    // Over the database URL, as `db migrate`: the root credential's path.
    let by = RunBy::Operator {
        actor: crate::access::bootstrap(),
        reason,
    };
    let report = retention::prune(&pool, &req, &by, &cancel, |p| {
        eprintln!(
            "{}: batch {} deleted {} row(s), {} so far",
            p.table.relation(),
            p.batch,
            p.deleted,
            p.total
        );
    })
    .await
    .map_err(|e| match e {
        RetentionError::Refused(r) => refusal(&r, a.older_than, a.batch).into(),
        e => anyhow::Error::new(e),
    })?;
    let stopped = report.stopped;
    render(&mut std::io::stdout().lock(), a.output, &PruneView(report))?;
    if stopped {
        bail!("the prune was stopped between batches; run it again to finish");
    }
    Ok(())
}

#[derive(Debug, Serialize)]
struct MigrationsView {
    database: String,
    migrations: Vec<MigrationRow>,
}

impl Tabular for MigrationsView {
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table(["VERSION", "DESCRIPTION", "STATE", "APPLIED AT"]);
        for m in &self.migrations {
            t.add_row([
                m.version.to_string(),
                m.description.clone(),
                format!("{:?}", m.state).to_uppercase(),
                m.applied_at
                    .map(|a| a.format("%Y-%m-%d %H:%M:%S UTC").to_string())
                    .unwrap_or_else(|| "-".into()),
            ]);
        }
        t
    }

    fn footer(&self) -> Vec<String> {
        match db::verdict(&self.migrations) {
            Ok(()) => vec![format!("{}: schema is current", self.database)],
            Err(e) => vec![format!("{}: {e}", self.database)],
        }
    }
}

pub async fn run(cmd: DbCmd, cfg: &Config) -> Result<()> {
    match cmd {
        DbCmd::Migrate => migrate(cfg).await,
        DbCmd::Status { output } => status(cfg, output).await,
        DbCmd::Prune(a) => prune(a, cfg).await,
    }
}

async fn migrate(cfg: &Config) -> Result<()> {
    // A read-only CLI refuses before connecting, as every other mutation.
    crate::access::writable(cfg, "db migrate")?;
    let pool = db::connect_unchecked(cfg).await?;
    let database = cfg.database_url_redacted();
    let before = db::status(&pool).await.ok();
    let applied = db::migrate(&pool).await?;
    // The audit table may be one of the migrations just applied, so
    // the row is written after (docs/security.md, "Bootstrap").
    let versions = |rows: &[MigrationRow]| -> Vec<i64> {
        rows.iter()
            .filter(|m| m.applied_at.is_some())
            .map(|m| m.version)
            .collect()
    };
    let entry = audit::Entry::new(
        "db migrate",
        applied.iter().map(|m| m.version.to_string()).collect(),
    )
    .before(serde_json::json!({ "applied": before.as_deref().map(versions) }))
    .after(serde_json::json!({ "applied": versions(&db::status(&pool).await?) }))
    .outcome(if applied.is_empty() {
        "CURRENT"
    } else {
        "APPLIED"
    });
    let mut conn = pool.acquire().await?;
    audit::record(&mut conn, &crate::access::bootstrap(), &entry).await?;
    if applied.is_empty() {
        println!("{database}: nothing to apply, schema is current");
    }
    for m in applied {
        println!("applied {} {}", m.version, m.description);
    }
    Ok(())
}

async fn status(cfg: &Config, output: OutputFormat) -> Result<()> {
    let pool = db::connect_unchecked(cfg).await?;
    let view = MigrationsView {
        database: cfg.database_url_redacted(),
        migrations: db::status(&pool).await?,
    };
    render(&mut std::io::stdout().lock(), output, &view)
}
