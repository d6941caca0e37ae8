//! `seckillctl audit list`: the operator audit log (docs/security.md, "What
//! is audited"), newest first.

use crate::output::{OutputFormat, Tabular, new_table, render};
use anyhow::Result;
use seckill_engine::{AuditRow, Config, audit, db};
use serde::Serialize;
use std::time::Duration;

#[derive(Debug, clap::Subcommand)]
pub enum AuditCmd {
    /// Who changed what, when, why, and the state before and after
    List {
        /// Only rows younger than this (e.g. 1h, 30m)
        #[arg(long, value_parser = crate::parse::duration)]
        since: Option<Duration>,
        /// Only this actor (a token's name, or `<user>@database-url`)
        #[arg(long)]
        operator: Option<String>,
        /// Only rows that touched this id (order, ticket, activity, message, token)
        #[arg(long)]
        target: Option<String>,
        /// Only this command (e.g. "order cancel")
        #[arg(long)]
        command: Option<String>,
        #[arg(long, default_value_t = 100)]
        limit: i64,
        #[arg(long, short, value_enum, default_value_t)]
        output: OutputFormat,
    },
}

#[derive(Debug, Serialize)]
struct AuditView {
    rows: Vec<AuditRow>,
}

impl Tabular for AuditView {
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table([
            "ID", "AT", "ACTOR", "ROLE", "VIA", "COMMAND", "TARGETS", "OUTCOME", "REASON",
        ]);
        for r in &self.rows {
            t.add_row([
                r.audit_id.to_string(),
                r.at.format("%Y-%m-%d %H:%M:%S").to_string(),
                r.actor.clone(),
                r.role.clone(),
                r.via.clone(),
                r.command.clone(),
                r.targets.join(" "),
                r.outcome.clone(),
                r.reason.clone().unwrap_or_else(|| "-".into()),
            ]);
        }
        t
    }

    fn footer(&self) -> Vec<String> {
        vec![format!(
            "{} row(s); `--output json` shows the state before and after",
            self.rows.len()
        )]
    }
}

pub async fn run(cmd: AuditCmd, cfg: &Config) -> Result<()> {
    let AuditCmd::List {
        since,
        operator,
        target,
        command,
        limit,
        output,
    } = cmd;
    let pool = db::connect(cfg).await?;
    let since = since
        .and_then(|d| chrono::Duration::from_std(d).ok())
        .map(|d| chrono::Utc::now() - d);
    let filter = audit::Filter {
        since,
        actor: operator,
        target,
        command,
        limit,
    };
    let rows = audit::list(&pool, &filter).await?;
    render(&mut std::io::stdout().lock(), output, &AuditView { rows })
}
