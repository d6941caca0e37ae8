//! Consumers restarted when the broker comes back after an outage, or when
//! the governor finds the order consumer stalled (`decide::stall`); both
//! ask through the send circuit's restart channel (docs/architecture.md §6.7).
//!
//! Why: rocketmq-rust 1.0.0 does not fail the requests in flight on a
//! connection that closes. A push consumer's long-polling pulls sent before
//! the broker died wait out their 30 s timeout, and their queues get nothing
//! until then: in the broker-restart drill the scanner had re-sent every
//! held reservation 1 s after the broker answered, and the orders still came
//! 28 s later. A new consumer pulls at once; the inbox absorbs whatever the
//! old one had taken and not acknowledged (§7).

use crate::mq::rocket::RocketConsumer;
use crate::mq::{ConsumerSpec, Handler};
use crate::runtime::ClientRuntime;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

/// A push consumer with the task that restarts it on each reconnect.
pub(super) struct Restarting {
    stop: CancellationToken,
    task: JoinHandle<()>,
}

/// What it takes to start the consumer again.
pub(super) struct Recipe<H> {
    pub rt: Arc<ClientRuntime>,
    pub namesrv: String,
    pub spec: ConsumerSpec,
    pub handler: Arc<H>,
}

impl<H: Handler> Recipe<H> {
    async fn start(&self) -> Result<RocketConsumer, crate::mq::rocket::MqError> {
        RocketConsumer::start(
            self.rt.clone(),
            &self.namesrv,
            &self.spec,
            self.handler.clone(),
        )
        .await
    }
}

impl Restarting {
    pub(super) fn spawn<H: Handler>(
        name: &'static str,
        first: RocketConsumer,
        recipe: Recipe<H>,
        mut reconnects: watch::Receiver<u64>,
    ) -> Self {
        let stop = CancellationToken::new();
        let stopped = stop.clone();
        let task = tokio::spawn(async move {
            let mut consumer = Some(first);
            loop {
                tokio::select! {
                    _ = stopped.cancelled() => break,
                    changed = reconnects.changed() => {
                        if changed.is_err() {
                            stopped.cancelled().await;
                            break;
                        }
                        if let Some(old) = consumer.take() {
                            old.shutdown().await;
                        }
                        consumer = restart(name, &recipe, &stopped).await;
                        if consumer.is_none() {
                            return;
                        }
                    }
                }
            }
            if let Some(c) = consumer {
                c.shutdown().await;
            }
        });
        Self { stop, task }
    }

    /// Stops the consumer (it finishes its in-flight batches) and the task.
    pub(super) async fn stop(self) {
        self.stop.cancel();
        let _ = self.task.await;
    }
}

/// Starts the consumer again, retrying each second until it starts or the
/// daemon stops (`None`).
async fn restart<H: Handler>(
    name: &'static str,
    recipe: &Recipe<H>,
    stop: &CancellationToken,
) -> Option<RocketConsumer> {
    loop {
        match recipe.start().await {
            Ok(c) => {
                tracing::warn!(
                    consumer = name,
                    "the broker is back: consumer restarted so its pulls start afresh"
                );
                return Some(c);
            }
            Err(e) => {
                tracing::error!(consumer = name, error = %e, "could not restart the consumer; retrying in 1 s");
                tokio::select! {
                    _ = stop.cancelled() => return None,
                    _ = tokio::time::sleep(Duration::from_secs(1)) => {}
                }
            }
        }
    }
}
