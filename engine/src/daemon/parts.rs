//! What the daemon started, kept in start order and stopped in reverse by
//! one piece of code, whether the daemon is shutting down or failed halfway
//! through starting (docs/architecture.md §2.1).
//!
//! Reverse start order is what makes shutdown safe: the consumers started
//! last stop pulling first and finish their in-flight batches (a batch is
//! ACKed only after its transaction commits, §7); then the background loops
//! (publisher, scanner, outbox, sweeps, governors) are cancelled and drained,
//! the publisher flushing what ingress queued; then the producer they sent
//! through; the pool, which everything used, closes last.

use super::restart::Restarting;
use crate::mq::rocket::RocketProducer;
use sqlx::PgPool;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

/// One started part and the way it stops.
pub(super) enum Part {
    Pool(PgPool),
    Producer(RocketProducer),
    /// Every background loop: told to stop, then awaited.
    Loops {
        tracker: TaskTracker,
        cancel: CancellationToken,
    },
    /// A push consumer, restarted after broker outages (`restart`).
    Consumer {
        name: &'static str,
        consumer: Restarting,
    },
}

impl Part {
    fn name(&self) -> &'static str {
        match self {
            Part::Pool(_) => "postgresql pool",
            Part::Producer(_) => "producer",
            Part::Loops { .. } => "background loops",
            Part::Consumer { name, .. } => name,
        }
    }

    async fn stop(self) {
        match self {
            Part::Pool(pool) => pool.close().await,
            Part::Producer(p) => p.shutdown().await,
            Part::Loops { tracker, cancel } => {
                cancel.cancel();
                tracker.close();
                tracker.wait().await;
            }
            Part::Consumer { consumer, .. } => consumer.stop().await,
        }
    }
}

/// The started parts, oldest first.
#[derive(Default)]
pub(super) struct Parts(Vec<Part>);

impl Parts {
    pub(super) fn started(&mut self, part: Part) {
        tracing::debug!(part = part.name(), "started");
        self.0.push(part);
    }

    /// Stops every part, newest first.
    pub(super) async fn stop_all(mut self) {
        while let Some(part) = self.0.pop() {
            tracing::debug!(part = part.name(), "stopping");
            part.stop().await;
        }
    }
}
