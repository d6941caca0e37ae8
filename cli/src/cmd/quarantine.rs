//! `seckillctl quarantine list|show|discard`: the messages a consumer
//! refused as malformed (docs/architecture.md §7.3), why, and their discard
//! on purpose. A discard goes through the engine's operator API with the
//! CLI's token (docs/security.md); `--direct` breaks glass over the
//! database URL.

use crate::exit::UsageError;
use crate::output::{OutputFormat, Tabular, new_table, render};
use anyhow::Result;
use seckill_engine::{
    Config, QuarantineDiscardBody, QuarantineError, QuarantineReason, Quarantined, db, quarantine,
};
use serde::Serialize;

#[derive(Debug, clap::Subcommand)]
pub enum QuarantineCmd {
    /// Quarantined messages, newest first (not the discarded ones, unless --all)
    List {
        #[arg(long)]
        group: Option<String>,
        /// BAD_JSON, UNSUPPORTED_SCHEMA, MISSING_FIELD or INVALID_FIELD
        #[arg(long)]
        reason: Option<QuarantineReason>,
        /// Discarded ones too
        #[arg(long)]
        all: bool,
        #[arg(long, default_value_t = 100)]
        limit: i64,
        #[arg(long, short, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// One quarantined message: why, its body (as text, the first 64 KiB) and properties
    Show {
        #[arg(long)]
        id: i64,
        #[arg(long, short, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// Mark a quarantined message discarded: looked at, nothing to do (audited)
    Discard {
        #[arg(long)]
        id: i64,
        /// Why (kept on the row and in the audit log)
        #[arg(long)]
        reason: String,
        #[arg(long, short, value_enum, default_value_t)]
        output: OutputFormat,
    },
}

#[derive(Debug, Serialize)]
struct Listed {
    messages: Vec<Quarantined>,
    /// Not discarded, per reason, over the whole quarantine.
    open: Vec<(QuarantineReason, i64)>,
}

fn rows(t: &mut comfy_table::Table, rows: &[Quarantined]) {
    for q in rows {
        t.add_row([
            q.quarantine_id.to_string(),
            q.created_at.format("%Y-%m-%d %H:%M:%S").to_string(),
            q.consumer_group.clone(),
            q.reason.to_string(),
            q.message_id.clone().unwrap_or_else(|| "-".into()),
            q.body_bytes.to_string(),
            q.discarded_by
                .as_ref()
                .map_or_else(|| "-".into(), |by| format!("discarded by {by}")),
            q.detail.chars().take(80).collect(),
        ]);
    }
}

fn header() -> comfy_table::Table {
    new_table([
        "ID",
        "AT",
        "GROUP",
        "REASON",
        "MESSAGE ID",
        "BYTES",
        "STATE",
        "DETAIL",
    ])
}

impl Tabular for Listed {
    fn table(&self) -> comfy_table::Table {
        let mut t = header();
        rows(&mut t, &self.messages);
        t
    }

    fn footer(&self) -> Vec<String> {
        let total: i64 = self.open.iter().map(|(_, n)| n).sum();
        let by: Vec<String> = self.open.iter().map(|(r, n)| format!("{r} {n}")).collect();
        vec![format!(
            "{} shown; {total} quarantined and not discarded ({})",
            self.messages.len(),
            if by.is_empty() {
                "none".to_owned()
            } else {
                by.join(", ")
            }
        )]
    }
}

#[derive(Debug, Serialize)]
#[serde(transparent)]
struct Shown(quarantine::Detail);

impl Tabular for Shown {
    fn table(&self) -> comfy_table::Table {
        let d = &self.0;
        let mut t = new_table(["FIELD", "VALUE"]);
        let q = &d.row;
        for (k, v) in [
            ("id", q.quarantine_id.to_string()),
            (
                "group / topic",
                format!("{} / {}", q.consumer_group, q.topic),
            ),
            (
                "message_id",
                q.message_id.clone().unwrap_or_else(|| "-".into()),
            ),
            (
                "broker_msg_id",
                q.broker_msg_id.clone().unwrap_or_else(|| "-".into()),
            ),
            ("reason", format!("{}: {}", q.reason, q.detail)),
            ("quarantined at", q.created_at.to_rfc3339()),
            (
                "discarded",
                match (&q.discarded_at, &q.discarded_by, &q.discard_reason) {
                    (Some(at), by, why) => format!(
                        "{} by {}: {}",
                        at.to_rfc3339(),
                        by.as_deref().unwrap_or("-"),
                        why.as_deref().unwrap_or("-")
                    ),
                    _ => "no".into(),
                },
            ),
            ("properties", d.properties.to_string()),
            (
                "body",
                format!(
                    "{} bytes{}: {}",
                    q.body_bytes,
                    if d.body_truncated {
                        " (first 64 KiB)"
                    } else {
                        ""
                    },
                    d.body
                ),
            ),
        ] {
            t.add_row([k.to_owned(), v]);
        }
        t
    }
}

#[derive(Debug, Serialize)]
#[serde(transparent)]
struct Discarded(Quarantined);

impl Tabular for Discarded {
    fn table(&self) -> comfy_table::Table {
        let mut t = header();
        rows(&mut t, std::slice::from_ref(&self.0));
        t
    }
}

pub async fn run(cmd: QuarantineCmd, cfg: &Config) -> Result<()> {
    let out = &mut std::io::stdout().lock();
    if let QuarantineCmd::Discard { id, reason, output } = cmd {
        crate::access::writable(cfg, "quarantine discard")?;
        if reason.trim().is_empty() {
            return Err(UsageError("--reason must say why it is discarded".into()).into());
        }
        let row = if cfg.auth.direct {
            let pool = db::connect(cfg).await?;
            quarantine::discard(&pool, id, &reason, &crate::access::direct())
                .await
                .map_err(|e| match e {
                    QuarantineError::Db(e) => anyhow::Error::from(e),
                    other => UsageError(other.to_string()).into(),
                })?
        } else {
            let body = QuarantineDiscardBody { reason };
            let path = format!("/v1/ops/quarantine/{id}/discard");
            crate::remote::answer(crate::remote::post(cfg, &path, &body).await?)?
        };
        return render(out, output, &Discarded(row));
    }
    let pool = db::connect(cfg).await?;
    match cmd {
        QuarantineCmd::List {
            group,
            reason,
            all,
            limit,
            output,
        } => {
            let filter = quarantine::Filter {
                group,
                reason,
                all,
                limit,
            };
            let listed = Listed {
                messages: quarantine::list(&pool, &filter).await?,
                open: quarantine::counts(&pool).await?,
            };
            render(out, output, &listed)
        }
        QuarantineCmd::Show { id, output } => match quarantine::show(&pool, id).await? {
            Some(d) => render(out, output, &Shown(d)),
            None => Err(UsageError(format!(
                "no quarantined message {id}; list them with `seckillctl quarantine list`"
            ))
            .into()),
        },
        QuarantineCmd::Discard { .. } => unreachable!("handled above"),
    }
}
