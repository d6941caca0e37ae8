//! The one Tokio runtime of a process.
//!
//! The RocketMQ client never builds its own runtime (ROCKETMQ.md, Runtime
//! ownership): it needs a `rocketmq_runtime::RuntimeOwner`. We build that owner
//! once, run the whole program (sqlx, redis, axum, the client) inside its
//! `block_on`, and hand the client a [`ClientRuntime`] made from it.
//!
//! The default owner caps synchronous listeners at 4 running and 16 queued
//! (the `metadata_io` blocking lane on 2 cores); past that the push consumer
//! turns the rejection into a spurious `ReconsumeLater`, and a listener that
//! overruns 30 s can run twice. We widen the lane to cover every consumer
//! thread the engine starts.

pub use rocketmq_client_rust::ClientRuntime;
use rocketmq_client_rust::{ClientRuntimeConfig, TelemetryHandle};
use rocketmq_runtime::{RuntimeConfig, RuntimeOwner};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

/// Listener threads the lane admits at once: at least the sum of every push
/// consumer's `consume_thread_min` in one process.
pub const MAX_LISTENER_CONCURRENCY: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("cannot build the runtime: {0}")]
    Build(String),
}

/// Builds the owner with the engine's blocking-lane policy.
pub fn build_owner() -> Result<RuntimeOwner, RuntimeError> {
    let mut cfg = RuntimeConfig::default()
        .with_max_blocking_threads(MAX_LISTENER_CONCURRENCY + 32)
        .map_err(|e| RuntimeError::Build(e.to_string()))?;
    let lane = &mut cfg.blocking_lane_policies.metadata_io;
    lane.max_concurrency = MAX_LISTENER_CONCURRENCY;
    lane.max_queue_depth = 4096;
    lane.task_timeout = Duration::from_secs(600);
    RuntimeOwner::plan(cfg)
        .map_err(|e| RuntimeError::Build(e.to_string()))?
        .build()
        .map_err(|e| RuntimeError::Build(e.to_string()))
}

/// Runs the future `f` builds on a fresh owner, handing it the client
/// runtime; then shuts the client runtime and the owner down in the
/// documented order (the caller shuts its producers and consumers first).
pub fn run<F, Fut>(f: F) -> Result<Fut::Output, RuntimeError>
where
    F: FnOnce(Arc<ClientRuntime>) -> Fut,
    Fut: Future,
{
    let owner = build_owner()?;
    let client = ClientRuntime::try_new(
        owner.root_context().component("seckill"),
        ClientRuntimeConfig::default(),
        TelemetryHandle::noop(),
    )
    .map_err(|e| RuntimeError::Build(e.to_string()))?;
    let out = owner.block_on(async {
        let out = f(client.clone()).await;
        let _ = client.shutdown().await;
        out
    });
    let _ = owner.shutdown_runtime_blocking_with_timeout(Duration::from_secs(5));
    Ok(out)
}
