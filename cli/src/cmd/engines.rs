//! `seckillctl engines`: every engine daemon in the registry, live or dead
//! (docs/architecture.md §14.3). Read over the database URL, so it answers
//! when no engine does.

use crate::output::{OutputFormat, Tabular, new_table, render};
use anyhow::Result;
use seckill_engine::{Config, EngineState, EngineView, db, engines};
use serde::Serialize;
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub struct EnginesArgs {
    /// Daemons heard from within this long (dead ones stay listed that long)
    #[arg(long, value_parser = crate::parse::duration, default_value = "1h")]
    since: Duration,
    #[arg(long, short, value_enum, default_value_t)]
    output: OutputFormat,
}

/// The JSON is the list itself: one object per daemon.
#[derive(Debug, Serialize)]
#[serde(transparent)]
struct EnginesView(Vec<EngineView>);

impl Tabular for EnginesView {
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table([
            "ID",
            "ADDRESS",
            "VERSION",
            "STATE",
            "HOST",
            "PID",
            "STARTED",
            "LAST HEARD",
        ]);
        for e in &self.0 {
            let state = match (e.state, e.dead_because) {
                (EngineState::Live, _) => "live".to_owned(),
                (EngineState::Dead, Some(why)) => format!("dead ({why:?})").to_lowercase(),
                (EngineState::Dead, None) => "dead".to_owned(),
            };
            t.add_row([
                e.id.clone(),
                e.address.clone(),
                e.version.clone(),
                state,
                e.hostname.clone(),
                e.pid.to_string(),
                e.started_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                format!("{:.1} s ago", e.heartbeat_age_ms as f64 / 1000.0),
            ]);
        }
        t
    }

    fn footer(&self) -> Vec<String> {
        let live = self
            .0
            .iter()
            .filter(|e| e.state == EngineState::Live)
            .count();
        let mut lines = vec![format!("{live} live, {} dead", self.0.len() - live)];
        let mut versions: Vec<&str> = self
            .0
            .iter()
            .filter(|e| e.state == EngineState::Live)
            .map(|e| e.version.as_str())
            .collect();
        versions.sort_unstable();
        versions.dedup();
        if versions.len() > 1 {
            lines.push(format!(
                "mixed versions live: {} (a rolling upgrade, or one left behind)",
                versions.join(", ")
            ));
        }
        lines
    }
}

pub async fn run(args: EnginesArgs, cfg: &Config) -> Result<()> {
    let pool = db::connect(cfg).await?;
    let window = chrono::Duration::from_std(args.since).unwrap_or(chrono::Duration::MAX);
    let views = engines::list(&pool, &cfg.registry, window).await?;
    render(
        &mut std::io::stdout().lock(),
        args.output,
        &EnginesView(views),
    )
}
