//! `seckillctl db migrate|status`.

use crate::output::{OutputFormat, Tabular, new_table, render};
use anyhow::Result;
use seckill_engine::{Config, MigrationRow, audit, db};
use serde::Serialize;

#[derive(Debug, clap::Subcommand)]
pub enum DbCmd {
    /// Apply every pending migration
    Migrate,
    /// List applied and pending migrations
    Status {
        #[arg(long, short, value_enum, default_value_t)]
        output: OutputFormat,
    },
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
    // A read-only CLI refuses before connecting, as every other mutation.
    if matches!(cmd, DbCmd::Migrate) {
        crate::access::writable(cfg, "db migrate")?;
    }
    let pool = db::connect_unchecked(cfg).await?;
    let database = cfg.database_url_redacted();
    let mut out = std::io::stdout().lock();
    match cmd {
        DbCmd::Migrate => {
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
        }
        DbCmd::Status { output } => {
            let view = MigrationsView {
                database,
                migrations: db::status(&pool).await?,
            };
            render(&mut out, output, &view)?;
        }
    }
    Ok(())
}
