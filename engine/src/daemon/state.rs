//! What every HTTP handler shares: the daemon's state and the one way a
//! request is refused. Its own file so the API's handlers (`http`) and the
//! operator API (`ops`) both sit above it, and neither imports the other.

use crate::daemon::api::ApiError;
use crate::daemon::governor::{Governor, SIGNAL_WINDOW};
use crate::domain::meters::Meters;
use crate::domain::stats::{ConsumeStats, LifecycleStats, PublishStats, StatsView};
use crate::mq::Names;
use crate::mq::position::Positions;
use crate::mq::rocket::RocketProducer;
use crate::pipeline::ingress::Ingress;
use crate::reservation::ReservationStore;
use crate::runtime::ClientRuntime;
use axum::Json;
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use sqlx::PgPool;
use std::sync::Arc;
use std::sync::atomic::AtomicBool;

/// What every handler shares, behind one `Arc`. axum clones the state for
/// every request; cloned field by field (the stores with their connection
/// handles and prefixes, the pool, the names), that clone and its drop took
/// about 4 % of the engine's CPU in a burst (`perf`, issue 24).
#[derive(Clone)]
pub struct AppState(Arc<Shared>);

impl AppState {
    pub fn new(shared: Shared) -> Self {
        Self(Arc::new(shared))
    }
}

impl std::ops::Deref for AppState {
    type Target = Shared;

    fn deref(&self) -> &Shared {
        &self.0
    }
}

pub struct Shared {
    pub ingress: Ingress,
    pub store: ReservationStore,
    pub pool: PgPool,
    pub stats: Arc<PublishStats>,
    pub circuit: Arc<crate::pipeline::circuit::SendCircuit>,
    pub lifecycle: Arc<LifecycleStats>,
    pub consume: Arc<ConsumeStats>,
    pub governor: Arc<Governor>,
    pub names: Names,
    /// Set once every component has started; cleared on shutdown.
    pub ready: Arc<AtomicBool>,
    /// The order consumer pulls (or stopped waiting to; see `daemon`).
    pub consuming: Arc<AtomicBool>,
    /// Where the consumers have got to, queue by queue (§10.4).
    pub positions: Arc<Positions>,
    /// Every send and delivery by topic and group (§11.1).
    pub meters: Meters,
    /// What the operator API's replays and restores need beyond the
    /// stores.
    pub ops: Arc<OpsDeps>,
}

/// The operator API's own needs (docs/security.md, "The operator API").
pub struct OpsDeps {
    /// Replays go out on the engine's own producer: the same broker
    /// connection the pipeline sends on, kept warm.
    pub producer: RocketProducer,
    /// For the broker admin a restore reads the order backlog with.
    pub rt: Arc<ClientRuntime>,
    pub namesrv: String,
    pub admin_timeout: std::time::Duration,
    /// `[dlq] broker_retention_hours`, for the replay pre-checks.
    pub retention: std::time::Duration,
}

impl Shared {
    pub fn stats_view(&self) -> StatsView {
        let view = StatsView::of(
            &self.stats,
            &self.lifecycle,
            &self.consume,
            SIGNAL_WINDOW,
            crate::store::db::pool_view(&self.pool),
            self.governor.view(),
            self.circuit.view(),
        );
        StatsView {
            positions: self.positions.view(),
            ..view
        }
    }
}

/// Marks a refusal made before the request's body was read whole (the
/// gate's, the limits', a 413): hyper then closes the connection rather
/// than leave the unread rest in it, and the header tells the client not to
/// send its next request down a connection about to close. Without it a
/// keep-alive client lost that next request to a broken pipe (found by the
/// sale-under-fire test, cli/tests/under_fire.rs). Where the body is small,
/// reading it first (`body::refuse_unread`) keeps the reply from being reset.
pub fn closing(mut r: Response) -> Response {
    r.headers_mut().insert(
        axum::http::header::CONNECTION,
        axum::http::HeaderValue::from_static("close"),
    );
    r
}

/// Every 4xx and 5xx: a stable code and a reason for people.
pub(super) fn reject(status: StatusCode, error: &str, reason: impl Into<String>) -> Response {
    (
        status,
        Json(ApiError {
            error: error.to_owned(),
            reason: reason.into(),
            retryable: status == StatusCode::SERVICE_UNAVAILABLE,
        }),
    )
        .into_response()
}
