//! `seckillctl health`: every component, probed for real, and every docs/architecture.md
//! §11.2 alert with its value, state and runbook. The exit code is the
//! worst state: 0 OK, 1 WARN, 2 CRITICAL, 3 unreachable.

use crate::exit::Exit;
use crate::output::{OutputFormat, Tabular, new_table, render};
use anyhow::Result;
use seckill_engine::{
    Alert, AlertState, ClientRuntime, ComponentHealth, Config, HealthState, Observer, Watch,
    alerts, health,
};
use serde::Serialize;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub struct HealthArgs {
    /// Time between the two samples the alert rates are computed from
    #[arg(long, value_parser = crate::parse::duration, default_value = "1s")]
    window: Duration,
    /// Components only: skip the engine and the alerts
    #[arg(long)]
    components_only: bool,
    #[arg(long, short, value_enum, default_value_t)]
    output: OutputFormat,
}

#[derive(Debug, Serialize)]
pub struct HealthOutput {
    pub components: Vec<ComponentHealth>,
    pub alerts: Vec<Alert>,
    /// OK, WARN, CRITICAL or UNREACHABLE: what the exit code says.
    pub worst: &'static str,
}

fn state(s: HealthState) -> String {
    format!("{s:?}").to_uppercase()
}

impl Tabular for HealthOutput {
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
                state(c.state),
                format!("{} ms", c.latency_ms),
                c.detail.clone().unwrap_or_default(),
            ]);
        }
        t
    }

    fn footer(&self) -> Vec<String> {
        let mut lines = Vec::new();
        if !self.alerts.is_empty() {
            let mut t = new_table([
                "ALERT (docs/architecture.md §11.2)",
                "VALUE",
                "WARN / CRITICAL",
                "STATE",
            ]);
            for a in &self.alerts {
                t.add_row([
                    a.metric.to_owned(),
                    a.shown.clone(),
                    a.thresholds.clone(),
                    format!("{:?}", a.state)
                        .to_uppercase()
                        .replace("NODATA", "NO DATA"),
                ]);
            }
            lines.push(t.to_string());
            for a in self.alerts.iter().filter(|a| a.state.firing()) {
                lines.push(format!(
                    "{:?}: {} = {} → runbook {}",
                    a.state, a.metric, a.shown, a.runbook
                ));
            }
        }
        lines.push(format!("overall: {}", self.worst));
        lines
    }
}

/// The worst of the components (degraded 1, down 3) and the alerts
/// (warn 1, critical 2).
fn worst(components: &[ComponentHealth], alerts: &[Alert]) -> Exit {
    let c = components
        .iter()
        .map(|c| match c.state {
            HealthState::Up => Exit::Ok,
            HealthState::Degraded => Exit::Warn,
            HealthState::Down => Exit::Unreachable,
        })
        .max_by_key(|e| e.code())
        .unwrap_or(Exit::Ok);
    let a = match alerts::worst(alerts) {
        AlertState::Critical => Exit::Critical,
        AlertState::Warn => Exit::Warn,
        _ => Exit::Ok,
    };
    if a.code() > c.code() { a } else { c }
}

pub async fn run(args: HealthArgs, cfg: &Config, rt: Arc<ClientRuntime>) -> Result<Exit> {
    // Everything at once, so a dead component costs one timeout, not several.
    let sample_twice = async {
        if args.components_only {
            return None;
        }
        let mut watch = Watch::new(Observer::new(cfg, rt.clone()));
        let o = watch.over(args.window).await;
        watch.shutdown().await;
        Some(o)
    };
    let engine_row = async {
        if args.components_only {
            Vec::new()
        } else {
            health::engines(cfg).await
        }
    };
    let (report, engine_row, observation) =
        tokio::join!(health::check(cfg, rt.clone()), engine_row, sample_twice);
    let mut components = report.components;
    components.extend(engine_row);
    let mut alerts = Vec::new();
    if let Some(o) = observation {
        alerts = o.alerts;
        // The DLQ row of `check` is an alert of its own here.
        components.retain(|c| c.component != "alert: dlq");
    }
    let exit = worst(&components, &alerts);
    let out = HealthOutput {
        worst: match exit {
            Exit::Ok => "OK",
            Exit::Warn => "WARN",
            Exit::Critical => "CRITICAL",
            _ => "UNREACHABLE",
        },
        components,
        alerts,
    };
    render(&mut std::io::stdout().lock(), args.output, &out)?;
    Ok(exit)
}
