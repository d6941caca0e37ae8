//! `seckillctl reconcile --activity A`: one verdict row per invariant of
//! docs/architecture.md §12; exits non-zero on a violation.

use crate::exit::Exit;
use crate::output::{OutputFormat, Tabular, new_table, render};
use anyhow::Result;
use seckill_engine::{
    ActivityId, Config, ReconcileReport as Report, ReconcileVerdict as Verdict, ReservationStore,
    db, reconcile, redis_conn,
};

#[derive(Debug, clap::Args)]
pub struct ReconcileArgs {
    #[arg(long)]
    activity: ActivityId,
    #[arg(long, short, value_enum, default_value_t)]
    output: OutputFormat,
}

impl Tabular for Report {
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table(["INVARIANT", "VERDICT", "EVIDENCE", "COUNTEREXAMPLES"]);
        for c in &self.checks {
            t.add_row([
                c.invariant.to_owned(),
                match c.verdict {
                    Verdict::Pass => "PASS".to_owned(),
                    Verdict::Fail => "FAIL".to_owned(),
                    Verdict::NotApplicable => "N/A".to_owned(),
                },
                c.evidence.clone(),
                c.counterexamples.join(", "),
            ]);
        }
        t
    }

    fn footer(&self) -> Vec<String> {
        vec![if self.passed() {
            format!("activity {}: every invariant holds", self.activity_id)
        } else {
            format!(
                "activity {}: INVARIANT VIOLATED (see FAIL rows)",
                self.activity_id
            )
        }]
    }
}

/// Exit 0 when every invariant holds, 5 when one is violated.
pub async fn run(args: ReconcileArgs, cfg: &Config) -> Result<Exit> {
    let pool = db::connect(cfg).await?;
    let store = ReservationStore::new(redis_conn::connect(cfg).await?, cfg.redis_prefix.clone());
    let report = reconcile::run(&pool, &store, args.activity).await?;
    let ok = report.passed();
    render(&mut std::io::stdout().lock(), args.output, &report)?;
    Ok(if ok { Exit::Ok } else { Exit::Violation })
}
