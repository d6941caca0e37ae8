//! `seckillctl drill list | run NAME… | run all | chaos`: replays the incidents of
//! docs/architecture.md §13.5 against private servers and reports, per
//! drill, the time to recover, the sends per reservation, the duplicates
//! absorbed, the DLQ count and the verdict.

use crate::drill::chaos::{self, ChaosRun};
use crate::drill::{Binaries, DrillName, DrillReport, Ports, Spec, World, run_one};
use crate::exit::Exit;
use crate::output::{OutputFormat, Tabular, new_table, render};
use anyhow::{Context, Result};
use seckill_engine::{ClientRuntime, Config};
use serde::Serialize;
use std::sync::Arc;

#[derive(Debug, clap::Subcommand)]
pub enum DrillCmd {
    /// Every drill: its injection, expected outcome, playbook, and whether CI runs it
    List {
        #[arg(long, short, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// Run drills by name, `all`, or `ci` (the fast subset scripts/test.sh runs)
    Run {
        /// Drill names, `all` or `ci`
        #[arg(required = true, value_parser = parse_selection)]
        drills: Vec<Selection>,
        /// First of the loopback ports the drill's private servers use
        /// (Redis, NameServer, Broker at +11, engines from +20)
        #[arg(long, env = "SECKILL_DRILL_PORT_BASE", default_value_t = 31000)]
        port_base: u16,
        #[arg(long, short, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// Sales with random mixes of the faults; every invariant checked after each
    Chaos {
        #[arg(long, default_value_t = 5)]
        runs: u32,
        /// Fixes every run's schedule: replay a failing run with the same seed
        #[arg(long)]
        seed: Option<u64>,
        #[arg(long, env = "SECKILL_DRILL_PORT_BASE", default_value_t = 31000)]
        port_base: u16,
        #[arg(long, short, value_enum, default_value_t)]
        output: OutputFormat,
    },
}

#[derive(Debug, Clone)]
pub enum Selection {
    One(DrillName),
    All,
    Ci,
}

fn parse_selection(s: &str) -> Result<Selection, String> {
    use clap::ValueEnum;
    match s {
        "all" => Ok(Selection::All),
        "ci" => Ok(Selection::Ci),
        _ => DrillName::from_str(s, false)
            .map(Selection::One)
            .map_err(|_| {
                let names: Vec<&str> = DrillName::ALL.iter().map(|d| d.as_str()).collect();
                format!("no drill {s:?}; pick from: all, ci, {}", names.join(", "))
            }),
    }
}

/// The drills a selection names, each once, in catalog order.
fn resolve(selection: &[Selection]) -> Vec<DrillName> {
    let mut out: Vec<DrillName> = DrillName::ALL
        .into_iter()
        .filter(|d| {
            selection.iter().any(|s| match s {
                Selection::All => true,
                Selection::Ci => d.spec().ci,
                Selection::One(n) => n == d,
            })
        })
        .collect();
    out.dedup();
    out
}

#[derive(Serialize)]
struct ListView {
    drills: Vec<Spec>,
}

impl Tabular for ListView {
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table([
            "DRILL",
            "ROW (§13.5)",
            "INJECTION",
            "EXPECTED",
            "PLAYBOOK",
            "CI",
        ]);
        for d in &self.drills {
            t.add_row([
                d.name.as_str().to_owned(),
                d.seed_row.map_or("-".to_owned(), |r| format!("#{r}")),
                d.injection.to_owned(),
                d.expected.to_owned(),
                d.playbook.to_owned(),
                if d.ci { "yes" } else { "" }.to_owned(),
            ]);
        }
        t
    }
}

#[derive(Serialize)]
struct RunView {
    drills: Vec<DrillReport>,
    /// The drill that could not run, and why; the ones after it did not run.
    aborted: Option<String>,
}

impl Tabular for RunView {
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table([
            "DRILL",
            "VERDICT",
            "RECOVERY (S)",
            "SENDS/AFFECTED",
            "DUPLICATES",
            "DLQ",
            "DETAIL",
        ]);
        for r in &self.drills {
            let f = &r.figures;
            let mut detail = f.notes.clone();
            if let crate::drill::verdict::Verdict::Fail(reasons) = &r.verdict {
                detail.extend(reasons.iter().cloned());
            }
            t.add_row([
                r.drill.as_str().to_owned(),
                if r.verdict.passed() { "PASS" } else { "FAIL" }.to_owned(),
                f.recovery_s.map_or("never".to_owned(), |s| {
                    format!("{s:.1} (≤ {:.0})", r.targets.recovery_s)
                }),
                match (f.sends_per_affected, r.targets.sends_per_affected) {
                    (Some(v), Some(limit)) => format!("{v:.2} of {} (≤ {limit})", f.affected),
                    (Some(v), None) => format!("{v:.2} of {}", f.affected),
                    (None, _) => "-".to_owned(),
                },
                f.duplicates_absorbed.to_string(),
                if f.dlq_applied > 0 {
                    format!("{} ({} applied; = {})", f.dlq, f.dlq_applied, r.targets.dlq)
                } else {
                    format!("{} (= {})", f.dlq, r.targets.dlq)
                },
                detail.join("; "),
            ]);
        }
        t
    }

    fn footer(&self) -> Vec<String> {
        let failed = self.drills.iter().filter(|r| !r.verdict.passed()).count();
        if let Some(why) = &self.aborted {
            return vec![format!("ABORTED: {why}")];
        }
        vec![if failed == 0 {
            format!("{} drill(s): every one passed", self.drills.len())
        } else {
            format!(
                "{failed} of {} drill(s) FAILED (see DETAIL)",
                self.drills.len()
            )
        }]
    }
}

#[derive(Serialize)]
struct ChaosView {
    seed: u64,
    runs: Vec<ChaosRun>,
    aborted: Option<String>,
}

impl Tabular for ChaosView {
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table([
            "RUN",
            "VERDICT",
            "FAULTS",
            "ACCEPTED",
            "DECIDED",
            "QUIET AFTER (S)",
            "DLQ",
            "VIOLATED",
        ]);
        for r in &self.runs {
            t.add_row([
                r.run.to_string(),
                if r.passed { "PASS" } else { "FAIL" }.to_owned(),
                r.steps
                    .iter()
                    .map(chaos::Step::label)
                    .collect::<Vec<_>>()
                    .join(", "),
                r.accepted.to_string(),
                r.decided.to_string(),
                r.quiet_after_s
                    .map_or("never".to_owned(), |s| format!("{s:.1}")),
                r.dlq.to_string(),
                r.violated.join("; "),
            ]);
        }
        t
    }

    fn footer(&self) -> Vec<String> {
        if let Some(why) = &self.aborted {
            return vec![format!("ABORTED: {why}")];
        }
        let failed = self.runs.iter().filter(|r| !r.passed).count();
        vec![format!(
            "seed {}: {} run(s), {failed} failed{}",
            self.seed,
            self.runs.len(),
            if failed > 0 {
                " (replay with the same --seed)"
            } else {
                ""
            }
        )]
    }
}

/// The error that stopped a run, else 0 when everything passed, 5 when
/// something failed.
fn exit(error: Option<anyhow::Error>, passed: bool) -> Result<Exit> {
    match error {
        Some(e) => Err(e),
        None if passed => Ok(Exit::Ok),
        None => Ok(Exit::Violation),
    }
}

/// Starts the private servers under a fresh directory.
async fn world(port_base: u16) -> Result<(World, std::path::PathBuf)> {
    let dir = std::env::temp_dir().join(format!("seckillctl-drill-{}", std::process::id()));
    eprintln!(
        "[drill] private servers on 127.0.0.1:{port_base}.. under {}",
        dir.display()
    );
    let world = World::start(&dir, Ports { base: port_base }, Binaries::from_env())
        .await
        .context("start the drill's private servers")?;
    Ok((world, dir))
}

/// Stops the servers; keeps the logs when something failed.
async fn finish(world: World, dir: &std::path::Path, passed: bool) {
    world.stop().await;
    if passed {
        let _ = std::fs::remove_dir_all(dir);
    } else {
        // The broker's store preallocates a gigabyte per commit log file;
        // runs that failed would fill the disk. The logs are what on-call
        // reads.
        let _ = std::fs::remove_dir_all(dir.join("broker").join("store"));
        eprintln!("[drill] logs kept under {}", dir.display());
    }
}

pub async fn run(cmd: DrillCmd, cfg: &Config, rt: Arc<ClientRuntime>) -> Result<Exit> {
    match cmd {
        DrillCmd::Chaos {
            runs,
            seed,
            port_base,
            output,
        } => {
            let seed = seed.unwrap_or_else(rand::random);
            let (mut world, dir) = world(port_base).await?;
            let (runs, error) = chaos::run_all(runs, seed, cfg, &mut world, rt, port_base).await;
            let passed = error.is_none() && runs.iter().all(|r| r.passed);
            finish(world, &dir, passed).await;
            let view = ChaosView {
                seed,
                runs,
                aborted: error.as_ref().map(|e| format!("{e:#}")),
            };
            render(&mut std::io::stdout().lock(), output, &view)?;
            exit(error, passed)
        }
        DrillCmd::List { output } => {
            let view = ListView {
                drills: DrillName::ALL.iter().map(|d| d.spec()).collect(),
            };
            render(&mut std::io::stdout().lock(), output, &view)?;
            Ok(Exit::Ok)
        }
        DrillCmd::Run {
            drills,
            port_base,
            output,
        } => {
            let names = resolve(&drills);
            let (mut world, dir) = world(port_base).await?;
            let mut reports = Vec::new();
            let mut error = None;
            for name in names {
                match run_one(name, cfg, &mut world, rt.clone(), port_base).await {
                    Ok(r) => {
                        eprintln!(
                            "[drill {}] {}",
                            name.as_str(),
                            if r.verdict.passed() { "PASS" } else { "FAIL" }
                        );
                        reports.push(r);
                    }
                    Err(e) => {
                        error =
                            Some(e.context(format!("the {} drill could not run", name.as_str())));
                        break;
                    }
                }
            }
            let passed = error.is_none() && reports.iter().all(|r| r.verdict.passed());
            finish(world, &dir, passed).await;
            let view = RunView {
                drills: reports,
                aborted: error.as_ref().map(|e| format!("{e:#}")),
            };
            render(&mut std::io::stdout().lock(), output, &view)?;
            exit(error, passed)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn selections_resolve_in_catalog_order_once() {
        let all = resolve(&[Selection::All, Selection::One(DrillName::Poison)]);
        assert_eq!(all, DrillName::ALL.to_vec());
        let ci = resolve(&[Selection::Ci]);
        assert!(ci.contains(&DrillName::EngineKill) && ci.contains(&DrillName::BrokerRestart));
        assert!(ci.iter().all(|d| d.spec().ci));
        assert_eq!(
            resolve(&[
                Selection::One(DrillName::Poison),
                Selection::One(DrillName::EngineKill)
            ]),
            vec![DrillName::EngineKill, DrillName::Poison]
        );
    }

    #[test]
    fn an_unknown_drill_lists_the_names() {
        let err = parse_selection("nope").unwrap_err();
        assert!(err.contains("engine-kill") && err.contains("all"), "{err}");
    }
}
