//! `seckillctl mq setup|lag`: topics, groups and their lag.

use crate::output::{OutputFormat, Tabular, new_table, render};
use anyhow::{Context, Result, bail};
use seckill_engine::{ClientRuntime, Config, Names, RocketAdmin, TopicKind, audit, db};
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, clap::Subcommand)]
pub enum MqCmd {
    /// Create or update the topics (docs/architecture.md §3 queue counts) and consumer groups; idempotent
    Setup {
        /// Keep retrying this long while the broker registers with the NameServer
        #[arg(long, value_parser = crate::parse::duration, default_value = "0s")]
        wait: Duration,
    },
    /// Lag of every seckill consumer group, in messages and seconds
    Lag {
        #[arg(long, short, value_enum, default_value_t)]
        output: OutputFormat,
    },
}

#[derive(Debug, Serialize)]
struct LagRow {
    group: String,
    topic: String,
    lag_messages: i64,
    lag_seconds: f64,
}

#[derive(Debug, Serialize)]
struct LagView {
    groups: Vec<LagRow>,
}

impl Tabular for LagView {
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table(["GROUP", "TOPIC", "LAG (MSGS)", "LAG (S)"]);
        for r in &self.groups {
            t.add_row([
                r.group.clone(),
                r.topic.clone(),
                r.lag_messages.to_string(),
                format!("{:.1}", r.lag_seconds),
            ]);
        }
        t
    }
}

pub async fn run(cmd: MqCmd, cfg: &Config, rt: Arc<ClientRuntime>) -> Result<()> {
    // The audit row of a setup goes to PostgreSQL before the broker is
    // touched (docs/security.md, "What is audited").
    let audited = match &cmd {
        MqCmd::Setup { .. } => {
            crate::access::writable(cfg, "mq setup")?;
            let pool = db::connect(cfg).await?;
            let entry = audit::Entry::new("mq setup", vec![cfg.namesrv_addr.clone()])
                .before(serde_json::json!({ "topic_prefix": cfg.topic_prefix }));
            let id = audit::open(&pool, &crate::access::bootstrap(), &entry).await?;
            Some((pool, id))
        }
        MqCmd::Lag { .. } => None,
    };
    let admin = RocketAdmin::start(rt, &cfg.namesrv_addr, cfg.admin_timeout()).await?;
    let result = match cmd {
        MqCmd::Setup { wait } => {
            let done = setup(&admin, cfg, wait).await;
            if let Some((pool, id)) = audited {
                audit::finish(&pool, id, &done).await?;
            }
            done.map(|lines| {
                for line in lines {
                    println!("{line}");
                }
            })
        }
        MqCmd::Lag { output } => lag(&admin, cfg, output).await,
    };
    admin.shutdown().await;
    result
}

async fn setup(admin: &RocketAdmin, cfg: &Config, wait: Duration) -> Result<Vec<String>> {
    let names = Names::new(cfg.topic_prefix.clone());
    let deadline = Instant::now() + wait;
    loop {
        match seckill_engine::setup_mq(admin, &names, cfg.mq.max_reconsume_times).await {
            Ok(created) => return Ok(created),
            Err(e) if Instant::now() < deadline => {
                eprintln!("waiting for the broker: {e}");
                tokio::time::sleep(Duration::from_secs(1)).await;
            }
            Err(e) => {
                return Err(e).context(format!(
                    "cannot create topics and groups through the NameServer at {}",
                    cfg.namesrv_addr
                ));
            }
        }
    }
}

async fn lag(admin: &RocketAdmin, cfg: &Config, output: OutputFormat) -> Result<()> {
    let names = Names::new(cfg.topic_prefix.clone());
    let mut groups = Vec::new();
    for kind in TopicKind::ALL {
        let (topic, group) = (names.topic(kind), names.group(kind));
        let lag = admin
            .lag(&topic, &group)
            .await
            .with_context(|| format!("lag of {group} on {topic}"))?;
        groups.push(LagRow {
            group,
            topic,
            lag_messages: lag.messages,
            lag_seconds: lag.seconds,
        });
    }
    if groups.is_empty() {
        bail!("no groups");
    }
    render(&mut std::io::stdout().lock(), output, &LagView { groups })
}
