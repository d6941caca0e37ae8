//! The automatic prune (docs/architecture.md §16.2): the daemon holding the
//! sweeps lease (§14.4) runs the same prune as `seckillctl db prune` over
//! every table whose run is due, every `[retention] every_hours`, keeping
//! `keep_hours`.
//!
//! Whether a run is due is read from `retention_marks.updated_at` on
//! PostgreSQL's clock, never from this process's memory: a restart or a
//! lease hand-over neither skips a day nor repeats one, and a run cut short
//! (the daemon stopping, PostgreSQL away) never stamped its table, so the
//! next look runs it again. A run already going when the lease lapses
//! finishes its batch and goes on: two prunes at once skip each other's
//! rows (`SKIP LOCKED`) and delete only what either may.

use crate::config::RetentionConfig;
use crate::daemon::singleton::Elected;
use crate::decide::retention::DEFAULT_BATCH;
use crate::domain::singleton::Singleton;
use crate::ops::retention::{self, PruneRequest, RunBy};
use std::time::Duration;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// The first look waits this long after the start: a daemon restarted in a
/// crash loop, or during a sale, does not add a prune to its start.
const START_DELAY: Duration = Duration::from_secs(300);

/// How often the holder looks whether a run is due: one cheap read.
const LOOK_EVERY: Duration = Duration::from_secs(300);

/// Spawns the retention loop; `floor` is `[dlq] broker_retention_hours`.
pub(super) fn spawn_retention(
    pool: sqlx::PgPool,
    cfg: RetentionConfig,
    floor: Duration,
    elected: Elected,
    tracker: &TaskTracker,
    cancel: CancellationToken,
) {
    tracker.spawn(async move {
        let mut wait = START_DELAY;
        loop {
            tokio::select! {
                _ = cancel.cancelled() => break,
                _ = tokio::time::sleep(wait) => {}
            }
            // At least a minute apart, whatever a hand-built config says.
            wait = LOOK_EVERY.min(cfg.every()).max(Duration::from_secs(60));
            if elected.holds(Singleton::Sweeps) {
                run_due(&pool, &cfg, floor, &cancel).await;
            }
        }
    });
}

/// One look: prune the tables that are due; a failure waits for the next
/// look, since nothing is lost by pruning later.
async fn run_due(
    pool: &sqlx::PgPool,
    cfg: &RetentionConfig,
    floor: Duration,
    cancel: &CancellationToken,
) {
    let tables = match retention::due(pool, cfg.every()).await {
        Ok(t) if t.is_empty() => return,
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(error = %e, "cannot read retention_marks; retrying next look");
            return;
        }
    };
    let req = PruneRequest {
        keep: cfg.keep(),
        floor,
        tables,
        batch: DEFAULT_BATCH,
        dry_run: false,
    };
    let progress = |p: &retention::Progress| {
        tracing::debug!(table = %p.table, batch = p.batch, deleted = p.deleted, total = p.total, "prune batch");
    };
    match retention::prune(pool, &req, &RunBy::Daemon, cancel, progress).await {
        Ok(report) => {
            for t in &report.tables {
                tracing::info!(
                    table = t.relation,
                    rows = t.rows,
                    batches = t.batches,
                    horizon = %t.horizon,
                    finished = t.finished,
                    "retention: pruned the finished history older than {} h",
                    report.keep_hours
                );
            }
        }
        Err(e) => tracing::warn!(error = %e, "retention prune failed; retrying next look"),
    }
}
