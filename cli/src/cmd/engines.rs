//! `seckillctl engines`: every engine daemon in the registry, live or dead,
//! and the singleton roles each holds (docs/architecture.md §14.3, §14.4).
//! Read over the database URL, so it answers when no engine does.

use crate::output::{OutputFormat, Tabular, new_table, render};
use anyhow::Result;
use seckill_engine::{
    Config, EngineState, EngineView, RoleState, RoleView, Singleton, db, engines,
};
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

/// The JSON is the list itself: one object per daemon, its `roles` among
/// its fields; the table adds a line per singleton.
#[derive(Debug)]
struct EnginesView {
    engines: Vec<EngineView>,
    roles: Vec<RoleView>,
}

impl Serialize for EnginesView {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.engines.serialize(s)
    }
}

impl Tabular for EnginesView {
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table([
            "ID",
            "ADDRESS",
            "VERSION",
            "STATE",
            "ROLES",
            "HOST",
            "PID",
            "STARTED",
            "LAST HEARD",
        ]);
        for e in &self.engines {
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
                Singleton::cell(&e.roles, ", "),
                e.hostname.clone(),
                e.pid.to_string(),
                e.started_at.format("%Y-%m-%d %H:%M:%S").to_string(),
                format!("{:.1} s ago", e.heartbeat_age_ms as f64 / 1000.0),
            ]);
        }
        t
    }

    fn footer(&self) -> Vec<String> {
        let all = &self.engines;
        let live = all.iter().filter(|e| e.state == EngineState::Live).count();
        let mut lines = vec![format!("{live} live, {} dead", all.len() - live)];
        for r in &self.roles {
            lines.push(match (r.state, &r.holder) {
                (RoleState::Held, Some(h)) => format!("{}: run by {h} ({} handovers)", r.role, r.handovers),
                (RoleState::HandingOver, _) => format!(
                    "{}: being handed over (given back a moment ago; the next heartbeat takes it)",
                    r.role
                ),
                (RoleState::HolderDead, Some(h)) => format!(
                    "{}: its holder {h} is dead; a live daemon takes it once the lease lapses ([registry] lease_ttl_ms)",
                    r.role
                ),
                _ if live == 0 => format!("{}: no daemon runs it (no engine is live)", r.role),
                _ => format!(
                    "{}: NO OWNER while {live} daemon(s) are live: runbooks/singleton-unowned.md",
                    r.role
                ),
            });
        }
        let mut versions: Vec<&str> = all
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
    let (views, roles) = engines::with_roles(&pool, &cfg.registry, window).await?;
    render(
        &mut std::io::stdout().lock(),
        args.output,
        &EnginesView {
            engines: views,
            roles,
        },
    )
}
