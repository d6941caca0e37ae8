//! `seckillctl config`: the effective configuration, secrets redacted.

use crate::output::{OutputFormat, Tabular, new_table, render};
use anyhow::Result;
use seckill_engine::{AuthMode, Config, HttpConfig, LogConfig, MqConfig, PgConfig, RegistryConfig};
use serde::Serialize;

#[derive(Debug, clap::Args)]
pub struct ConfigArgs {
    #[arg(long, short, value_enum, default_value_t)]
    output: OutputFormat,
}

#[derive(Debug, Serialize)]
struct View {
    database_url: String,
    redis_url: String,
    namesrv_addr: String,
    topic_prefix: String,
    redis_prefix: String,
    pg: PgConfig,
    mq: MqConfig,
    http: HttpConfig,
    auth: AuthView,
    log: LogConfig,
    registry: RegistryConfig,
    /// The engines the console reads; empty: every live one of the registry.
    engine_urls: Vec<String>,
}

/// `[auth]` without the secret: whether a token is set, never the token.
#[derive(Debug, Serialize)]
struct AuthView {
    mode: AuthMode,
    token: &'static str,
    token_file: Option<String>,
    readonly: bool,
    refresh_ms: u64,
}

impl Tabular for View {
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table(["KEY", "VALUE"]);
        let value = serde_json::to_value(self).unwrap_or_default();
        if let serde_json::Value::Object(map) = value {
            for (k, v) in map {
                match v {
                    serde_json::Value::Object(inner) => {
                        for (ik, iv) in inner {
                            t.add_row([format!("{k}.{ik}"), iv.to_string()]);
                        }
                    }
                    serde_json::Value::String(s) => {
                        t.add_row([k, s]);
                    }
                    other => {
                        t.add_row([k, other.to_string()]);
                    }
                }
            }
        }
        t
    }
}

pub fn run(args: ConfigArgs, cfg: &Config) -> Result<()> {
    let view = View {
        database_url: cfg.database_url_redacted(),
        redis_url: cfg.redis_url_redacted(),
        namesrv_addr: cfg.namesrv_addr.clone(),
        topic_prefix: cfg.topic_prefix.clone(),
        redis_prefix: cfg.redis_prefix.clone(),
        pg: cfg.pg.clone(),
        mq: cfg.mq.clone(),
        http: cfg.http.clone(),
        log: cfg.log.clone(),
        registry: cfg.registry.clone(),
        engine_urls: cfg.engine_urls.clone(),
        auth: AuthView {
            mode: cfg.auth.mode,
            token: if cfg.auth.token.is_some() {
                "[set]"
            } else {
                "[none]"
            },
            token_file: cfg
                .auth
                .token_file
                .as_ref()
                .map(|p| p.display().to_string()),
            readonly: cfg.auth.readonly,
            refresh_ms: cfg.auth.refresh_ms,
        },
    };
    render(&mut std::io::stdout().lock(), args.output, &view)
}
