//! `seckillctl health`: every component, probed for real.

use crate::exit::Exit;
use crate::output::{OutputFormat, Tabular, new_table, render};
use anyhow::Result;
use seckill_engine::config::Config;
use seckill_engine::health::{self, HealthReport, HealthState};
use seckill_engine::runtime::ClientRuntime;
use std::sync::Arc;

#[derive(Debug, clap::Args)]
pub struct HealthArgs {
    #[arg(long, short, value_enum, default_value_t)]
    output: OutputFormat,
}

impl Tabular for HealthReport {
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table([
            "COMPONENT",
            "ENDPOINT",
            "VERSION",
            "STATE",
            "LATENCY",
            "DETAIL",
        ]);
        for c in &self.components {
            t.add_row([
                c.component.clone(),
                c.endpoint.clone(),
                c.version.clone().unwrap_or_else(|| "-".into()),
                format!("{:?}", c.state).to_uppercase(),
                format!("{} ms", c.latency_ms),
                c.detail.clone().unwrap_or_default(),
            ]);
        }
        t
    }
}

/// Exit code: 0 when everything is up, 1 when something is degraded
/// (reachable but not usable, e.g. schema behind), 3 when something is down.
pub async fn run(args: HealthArgs, cfg: &Config, rt: Arc<ClientRuntime>) -> Result<Exit> {
    let report = health::check(cfg, rt).await;
    let worst = report.worst();
    render(&mut std::io::stdout().lock(), args.output, &report)?;
    Ok(match worst {
        HealthState::Up => Exit::Ok,
        HealthState::Degraded => Exit::Warn,
        HealthState::Down => Exit::Unreachable,
    })
}
