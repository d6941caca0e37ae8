//! `seckillctl drill chaos`: sales with random mixes of the faults, each
//! checked against every invariant. The seed fixes every run's schedule, so
//! a failing run is replayed with the same `--seed` (docs/architecture.md
//! §13.5).

use super::faults::{Fault, apply};
use super::servers::World;
use super::stage::{SalePlan, Stage};
use anyhow::{Context, Result};
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use seckill_engine::{ClientRuntime, Config, TopicKind, facts};
use serde::Serialize;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// One fault, when the crowd has sent this share of its requests.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Step {
    pub at: f64,
    #[serde(flatten)]
    pub fault: Fault,
}

impl Step {
    pub fn label(&self) -> String {
        format!("{} at {:.0}%", self.fault.label(), self.at * 100.0)
    }
}

/// Engines in a chaos sale: faults may hit either.
const ENGINES: usize = 2;

/// The schedule of run `run` under `seed`: one to three faults at sorted
/// points of the crowd. Pure, so a seed names its runs for good.
pub fn schedule(seed: u64, run: u32) -> Vec<Step> {
    let mut rng = StdRng::seed_from_u64(seed ^ (u64::from(run) << 32 | u64::from(run)));
    let n = rng.random_range(1..=3);
    let mut steps: Vec<Step> = (0..n)
        .map(|_| {
            let fault = match rng.random_range(0..4) {
                0 => Fault::KillEngine(rng.random_range(0..ENGINES)),
                1 => Fault::RestartBroker,
                2 => Fault::CutLink,
                _ => Fault::LockSku,
            };
            Step {
                at: (rng.random_range(5..=90) as f64) / 100.0,
                fault,
            }
        })
        .collect();
    steps.sort_by(|a, b| a.at.total_cmp(&b.at));
    steps
}

/// One chaos run's result.
#[derive(Debug, Clone, Serialize)]
pub struct ChaosRun {
    pub run: u32,
    pub seed: u64,
    pub steps: Vec<Step>,
    pub accepted: u64,
    pub decided: i64,
    /// From the last fault healing to quiet.
    pub quiet_after_s: Option<f64>,
    pub dlq: i64,
    pub violated: Vec<String>,
    pub passed: bool,
}

/// Runs `runs` chaos sales under `seed`, one after the other. The runs
/// done, and the error that stopped the rest, if one did.
pub async fn run_all(
    runs: u32,
    seed: u64,
    base: &Config,
    world: &mut World,
    rt: Arc<ClientRuntime>,
    port_base: u16,
) -> (Vec<ChaosRun>, Option<anyhow::Error>) {
    let mut out = Vec::new();
    for run in 0..runs {
        let steps = schedule(seed, run);
        let labels: Vec<String> = steps.iter().map(Step::label).collect();
        eprintln!("[chaos {run}/{runs}] seed {seed}: {}", labels.join(", "));
        let r = match one(run, seed, steps, base, world, rt.clone(), port_base)
            .await
            .with_context(|| format!("chaos run {run} (seed {seed}) could not run"))
        {
            Ok(r) => r,
            Err(e) => return (out, Some(e)),
        };
        eprintln!(
            "[chaos {run}/{runs}] {}",
            if r.passed { "PASS" } else { "FAIL" }
        );
        out.push(r);
    }
    (out, None)
}

async fn one(
    run: u32,
    seed: u64,
    steps: Vec<Step>,
    base: &Config,
    world: &mut World,
    rt: Arc<ClientRuntime>,
    port_base: u16,
) -> Result<ChaosRun> {
    let plan = SalePlan {
        stock: 2_000,
        users: 3_000,
        rate: 600,
        ..SalePlan::default()
    };
    let toml = format!(
        "[consumer]\nbatch_max = 16\nthreads = 4\n[publisher]\nbatch_max = 16\n[mq]\nmax_reconsume_times = 2\n{}",
        super::run::DRILL_SEND_TIMEOUT
    );
    let mut stage = Stage::prepare(
        &format!("chaos-{run}"),
        base,
        world,
        rt,
        plan,
        &toml,
        port_base,
    )
    .await?;
    let result = drive(&mut stage, world, &steps).await;
    stage.finish().await;
    let (accepted, decided, quiet_after_s, dlq, violated) = result?;
    Ok(ChaosRun {
        run,
        seed,
        passed: violated.is_empty() && quiet_after_s.is_some() && dlq == 0,
        steps,
        accepted,
        decided,
        quiet_after_s,
        dlq,
        violated,
    })
}

type Outcome = (u64, i64, Option<f64>, i64, Vec<String>);

async fn drive(stage: &mut Stage, world: &mut World, steps: &[Step]) -> Result<Outcome> {
    for i in 0..ENGINES {
        stage.start_engine(i).await?;
    }
    let crowd = stage.start_crowd();
    for step in steps {
        crowd
            .until_sent((stage.plan.users as f64 * step.at) as u64)
            .await;
        let note = apply(step.fault, world, stage).await?;
        eprintln!("[chaos]   {note}");
    }
    let healed = Instant::now();
    let tally = crowd.finish().await;
    let accepted = tally.distinct();
    let quiet = stage
        .wait_quiet(accepted, 0, Duration::from_secs(120))
        .await?;
    let p = facts::progress(&stage.pool, &stage.store, stage.activity).await?;
    let (_, dlq) = stage.stored(TopicKind::OrderCreate).await?;
    let violated = stage.violated().await?;
    Ok((
        accepted,
        p.decided,
        quiet.map(|at| at.saturating_duration_since(healed).as_secs_f64()),
        dlq,
        violated,
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_seed_fixes_every_runs_schedule() {
        for run in 0..50 {
            assert_eq!(schedule(7, run), schedule(7, run));
        }
        let differs = (0..20).any(|run| schedule(7, run) != schedule(8, run));
        assert!(differs, "another seed, other schedules");
        let runs_differ = (1..20).any(|run| schedule(7, run) != schedule(7, 0));
        assert!(runs_differ, "runs of one seed are not all the same");
    }

    #[test]
    fn schedules_are_one_to_three_sorted_faults_inside_the_crowd() {
        let mut kinds = std::collections::HashSet::new();
        for run in 0..200 {
            let s = schedule(42, run);
            assert!((1..=3).contains(&s.len()), "{s:?}");
            assert!(s.windows(2).all(|w| w[0].at <= w[1].at), "{s:?}");
            for step in &s {
                assert!((0.05..=0.9).contains(&step.at), "{s:?}");
                if let Fault::KillEngine(i) = step.fault {
                    assert!(i < ENGINES);
                }
                kinds.insert(std::mem::discriminant(&step.fault));
            }
        }
        assert_eq!(kinds.len(), 4, "every kind of fault comes up");
    }
}
