//! The one observation loop: sample → history → views → alerts
//! (docs/architecture.md §11.4). The daemon's governor, the TUI,
//! `backlog --watch`, `health`, `pg`, `pending` and `scale advise` all read
//! the pipeline through [`Watch`], so a figure means the same thing on every
//! screen: rates always compare two samples at least [`RATE_SPAN`] apart.
//!
//! [`RATE_SPAN`]: super::RATE_SPAN

use super::view::{self, BacklogRow, EngineRow, PendingRow, PgView};
use super::{History, Observer, Sample, Source};
use crate::config::Config;
use crate::decide::alerts::{self, Alert};
use crate::decide::scale::{self, Advice, ScaleInputs};
use crate::domain::stats::StatsView;
use crate::mq::Names;
use serde::Serialize;
use std::time::Duration;

/// One turn of the loop: the newest sample and everything derived from it
/// and the base sample its rates compare against.
#[derive(Debug, Clone, Serialize)]
pub struct Observation {
    pub sample: Sample,
    pub backlog: Vec<BacklogRow>,
    pub pending: Vec<PendingRow>,
    pub pg: PgView,
    /// Each daemon asked or known dead (docs/architecture.md §14.3).
    pub engines: Vec<EngineRow>,
    pub scale_inputs: ScaleInputs,
    pub advice: Advice,
    pub alerts: Vec<Alert>,
}

impl Observation {
    /// Derives every view from `cur` and the `base` its rates compare
    /// against (none on the first sample: rates are then unknown). Pure.
    pub fn derive(base: Option<&Sample>, cur: Sample, cfg: &Config, names: &Names) -> Self {
        let backlog = view::backlog(base, &cur, names);
        let pg = view::pg(base, &cur);
        let scale_inputs = view::scale_inputs(base, &cur, &backlog, &pg, cfg, names);
        Self {
            backlog,
            pending: view::pending(&cur),
            engines: view::engines(&cur),
            pg,
            advice: scale::advise(&scale_inputs),
            alerts: alerts::evaluate(&cfg.alerts, &view::alert_inputs(base, &cur)),
            scale_inputs,
            sample: cur,
        }
    }

    /// Whether the sample saw the sources every decision leans on. A blind
    /// tick (the broker or Redis unreadable) must not open or close the
    /// admission gate on made-up zeros (docs/architecture.md §10.9).
    pub fn sighted(&self) -> bool {
        self.sample.error(Source::Rocketmq).is_none() && self.sample.error(Source::Redis).is_none()
    }
}

/// An [`Observer`] with its history: each [`Watch::next`] is one turn.
pub struct Watch {
    observer: Observer,
    history: History,
}

impl Watch {
    pub fn new(observer: Observer) -> Self {
        Self {
            observer,
            history: History::default(),
        }
    }

    /// Samples every source and derives the views.
    pub async fn next(&mut self) -> Observation {
        self.next_with(None).await
    }

    /// Like [`Watch::next`], with the engine's own figures supplied by the
    /// caller: the daemon is the engine, so it has nothing to fetch.
    pub async fn next_with(&mut self, engine: Option<StatsView>) -> Observation {
        let mut cur = self.observer.sample().await;
        if engine.is_some() {
            cur.engine = engine;
        }
        let base = self.history.push(cur.clone());
        Observation::derive(base, cur, self.observer.config(), self.observer.names())
    }

    /// Two turns `window` apart: what a one-shot command reports, with
    /// rates over that window.
    pub async fn over(&mut self, window: Duration) -> Observation {
        self.next().await;
        tokio::time::sleep(window).await;
        self.next().await
    }

    pub fn observer(&self) -> &Observer {
        &self.observer
    }

    pub async fn shutdown(self) {
        self.observer.shutdown().await;
    }
}
