//! `seckillctl trace <id>` (docs/architecture.md §11.6): one reservation's
//! story from PostgreSQL, Redis and what the broker's side left in them,
//! as one timeline, with a verdict. Exit 0 consistent, 1 in flight, 5
//! broken, 64 for an id nobody knows.

use crate::exit::Exit;
use crate::output::{OutputFormat, Tabular, new_table, render};
use anyhow::Result;
use seckill_engine::{
    ClientRuntime, Config, Names, ReservationStore, RocketAdmin, Story, StoryVerdict, TraceAnchor,
    TraceError, TraceSources, db, redis_conn, trace_story,
};
use std::sync::Arc;

#[derive(Debug, clap::Args)]
pub struct TraceArgs {
    /// A message (evt_…), reservation (rsv_…), order (ord_…) or request (req_…) id
    id: String,
    #[arg(long, short, value_enum, default_value_t)]
    output: OutputFormat,
}

impl Tabular for Story {
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table(["AT", "SOURCE", "EVENT", "DETAIL"]);
        for l in &self.lines {
            t.add_row([
                l.at.map_or("-".to_owned(), |a| a.format("%H:%M:%S%.3f").to_string()),
                l.source.to_owned(),
                l.event.clone(),
                l.detail.clone(),
            ]);
        }
        t
    }

    fn footer(&self) -> Vec<String> {
        vec![
            format!(
                "reservation {} (activity {}), trace {}",
                self.reservation_id, self.activity_id, self.trace_id
            ),
            format!("{}: {}", verdict_word(self.verdict), self.reason),
        ]
    }
}

fn verdict_word(v: StoryVerdict) -> &'static str {
    match v {
        StoryVerdict::Consistent => "CONSISTENT",
        StoryVerdict::InFlight => "IN FLIGHT",
        StoryVerdict::Broken => "BROKEN",
    }
}

pub async fn run(args: TraceArgs, cfg: &Config, rt: Arc<ClientRuntime>) -> Result<Exit> {
    let anchor: TraceAnchor = match args.id.parse() {
        Ok(a) => a,
        Err(e) => {
            eprintln!("error: {e}");
            return Ok(Exit::Usage);
        }
    };
    let pool = db::connect(cfg).await?;
    let store = ReservationStore::new(redis_conn::connect(cfg).await?, cfg.redis_prefix.clone());
    // Without the broker the story still holds what PostgreSQL recorded
    // of it; the lookup's failure is said, not fatal.
    let names = Names::new(cfg.topic_prefix.clone());
    let admin = match RocketAdmin::start(rt, &cfg.namesrv_addr, cfg.admin_timeout()).await {
        Ok(a) => Some(a),
        Err(e) => {
            eprintln!("warning: the broker's copies are not looked up: {e}");
            None
        }
    };
    let sources = TraceSources {
        pool: &pool,
        store: &store,
        broker: admin.as_ref().map(|a| (a, &names)),
    };
    let traced = trace_story(&sources, &anchor, &args.id).await;
    if let Some(a) = admin {
        a.shutdown().await;
    }
    let story = match traced {
        Ok(s) => s,
        Err(e @ TraceError::Unknown(_)) => {
            eprintln!("error: {e}");
            return Ok(Exit::Usage);
        }
        Err(e) => return Err(e.into()),
    };
    render(&mut std::io::stdout().lock(), args.output, &story)?;
    Ok(match story.verdict {
        StoryVerdict::Consistent => Exit::Ok,
        StoryVerdict::InFlight => Exit::Warn,
        StoryVerdict::Broken => Exit::Violation,
    })
}
