//! `seckillctl auth token create|list|revoke` (docs/security.md, "Tokens").
//!
//! These run over the database URL: holding it is the root credential, and
//! this is how the first admin token comes to be. Every change is audited
//! in the same transaction (via `bootstrap`).

use crate::access;
use crate::exit::UsageError;
use crate::output::{OutputFormat, Tabular, new_table, render};
use anyhow::Result;
use seckill_engine::{Config, Role, TokenError, TokenRow, db, tokens};
use serde::Serialize;

#[derive(Debug, clap::Subcommand)]
pub enum AuthCmd {
    /// Bearer tokens for the engine's API
    #[command(subcommand)]
    Token(TokenCmd),
}

#[derive(Debug, clap::Subcommand)]
pub enum TokenCmd {
    /// Issue a token; its secret is printed once, alone on the last line
    Create {
        /// A name for audit rows and logs: a-z, 0-9, '.', '_', '-'
        #[arg(long)]
        name: String,
        /// ingress, payments, reader, operator or admin
        #[arg(long)]
        role: Role,
        #[arg(long, short, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// The tokens (never their secrets)
    List {
        /// Show revoked tokens too
        #[arg(long)]
        all: bool,
        #[arg(long, short, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// Revoke a token; the daemons refuse it within `[auth] refresh_ms`
    Revoke {
        #[arg(long)]
        name: String,
        /// Why (kept in the audit log)
        #[arg(long)]
        reason: Option<String>,
    },
}

#[derive(Debug, Serialize)]
struct Tokens {
    tokens: Vec<TokenRow>,
}

impl Tabular for Tokens {
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table(["NAME", "ROLE", "CREATED", "BY", "REVOKED"]);
        let ts = |t: chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%d %H:%M:%S").to_string();
        for r in &self.tokens {
            t.add_row([
                r.name.clone(),
                r.role.clone(),
                ts(r.created_at),
                r.created_by.clone(),
                r.revoked_at.map_or("-".into(), ts),
            ]);
        }
        t
    }
}

#[derive(Debug, Serialize)]
struct Created<'a> {
    name: &'a str,
    role: Role,
    token: &'a str,
}

pub async fn run(cmd: AuthCmd, cfg: &Config) -> Result<()> {
    let AuthCmd::Token(cmd) = cmd;
    if !matches!(cmd, TokenCmd::List { .. }) {
        access::writable(cfg, "auth token")?;
    }
    let pool = db::connect(cfg).await?;
    let actor = access::bootstrap();
    match cmd {
        TokenCmd::Create { name, role, output } => {
            let secret = tokens::create(&pool, &name, role, &actor)
                .await
                .map_err(usage)?;
            match output {
                OutputFormat::Json => {
                    let created = Created {
                        name: &name,
                        role,
                        token: &secret,
                    };
                    println!("{}", serde_json::to_string_pretty(&created)?);
                }
                OutputFormat::Table => {
                    eprintln!(
                        "token {name:?} (role {role}) created; it is shown once, below. Hand it over as SECKILL_TOKEN or an [auth] token_file."
                    );
                    println!("{secret}");
                }
            }
        }
        TokenCmd::List { all, output } => {
            let tokens = tokens::list(&pool, all).await?;
            render(&mut std::io::stdout().lock(), output, &Tokens { tokens })?;
        }
        TokenCmd::Revoke { name, reason } => {
            let row = tokens::revoke(&pool, &name, &actor, reason.as_deref())
                .await
                .map_err(usage)?;
            println!(
                "token {:?} (role {}) revoked; running engines refuse it within {} ms",
                row.name, row.role, cfg.auth.refresh_ms
            );
        }
    }
    Ok(())
}

/// A name taken, unknown or malformed is the user's to fix (exit 64).
fn usage(e: TokenError) -> anyhow::Error {
    match e {
        TokenError::Db(e) => e.into(),
        other => UsageError(other.to_string()).into(),
    }
}
