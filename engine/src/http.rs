//! The daemon's HTTP surface (DESIGN.md §13): reservation ingress, status
//! query, liveness, readiness and stats. Handlers validate everything before
//! touching Redis: a malformed request gets a 4xx with a reason and writes
//! nothing.

use crate::governor::Governor;
use crate::ids::{ActivityId, MessageId, OrderId, RequestId, ReservationId, SkuId, UserId};
use crate::message::TraceContext;
use crate::mq::Names;
use crate::order::{self, PayOutcome};
use crate::publish::{Publisher, order_message};
use crate::reservation::{ReservationStore, ReserveOutcome, ReserveRequest};
use crate::stats::{ConsumeStats, LifecycleStats, Percentiles, PublishStats};
use axum::extract::{Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use serde::{Deserialize, Serialize};
use sqlx::PgPool;
use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use tokio::sync::RwLock;

#[derive(Clone)]
pub struct AppState {
    pub store: ReservationStore,
    pub pool: PgPool,
    pub publisher: Publisher,
    pub stats: Arc<PublishStats>,
    pub lifecycle: Arc<LifecycleStats>,
    pub consume: Arc<ConsumeStats>,
    pub governor: Arc<Governor>,
    pub names: Names,
    /// Set once every component has started; cleared on shutdown.
    pub ready: Arc<AtomicBool>,
    /// The order consumer pulls (or stopped waiting to; see `daemon`).
    pub consuming: Arc<AtomicBool>,
    /// Activity validity windows, read from PostgreSQL once per activity.
    pub activities: Arc<RwLock<HashMap<ActivityId, i64>>>,
    pub first_retry_after_ms: i64,
}

pub fn router(state: AppState) -> Router {
    Router::new()
        .route(
            "/v1/activities/{activity}/skus/{sku}/reservations",
            post(reserve),
        )
        .route("/v1/reservations/{id}", get(reservation_status))
        .route("/v1/orders/{id}", get(order_show))
        .route("/v1/orders/{id}/pay", post(order_pay))
        .route("/v1/stats", get(stats))
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

#[derive(Debug, Serialize)]
struct ApiError {
    error: &'static str,
    reason: String,
}

fn reject(status: StatusCode, error: &'static str, reason: impl Into<String>) -> Response {
    (
        status,
        Json(ApiError {
            error,
            reason: reason.into(),
        }),
    )
        .into_response()
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct ReserveBody {
    user_id: i64,
    request_id: String,
}

#[derive(Debug, Serialize)]
struct Queued {
    status: &'static str,
    reservation_id: ReservationId,
    order_id: OrderId,
    message_id: MessageId,
}

async fn valid_for_ms(state: &AppState, activity: ActivityId) -> Result<Option<i64>, sqlx::Error> {
    if let Some(v) = state.activities.read().await.get(&activity) {
        return Ok(Some(*v));
    }
    let v: Option<i64> =
        sqlx::query_scalar("SELECT valid_for_ms FROM activities WHERE activity_id = $1")
            .bind(activity)
            .fetch_optional(&state.pool)
            .await?;
    if let Some(v) = v {
        state.activities.write().await.insert(activity, v);
    }
    Ok(v)
}

async fn reserve(
    State(state): State<AppState>,
    Path((activity, sku)): Path<(String, String)>,
    body: Result<Json<ReserveBody>, axum::extract::rejection::JsonRejection>,
) -> Response {
    let Ok(activity) = activity.parse::<ActivityId>() else {
        return reject(
            StatusCode::BAD_REQUEST,
            "BAD_ACTIVITY_ID",
            "activity id must be a positive integer",
        );
    };
    let Ok(sku) = sku.parse::<SkuId>() else {
        return reject(
            StatusCode::BAD_REQUEST,
            "BAD_SKU_ID",
            "sku id must be a positive integer",
        );
    };
    let body = match body {
        Ok(Json(b)) => b,
        Err(e) => return reject(StatusCode::BAD_REQUEST, "BAD_BODY", e.body_text()),
    };
    if body.user_id <= 0 {
        return reject(
            StatusCode::BAD_REQUEST,
            "BAD_USER_ID",
            "user_id must be a positive integer",
        );
    }
    let request_id = match RequestId::parse(&body.request_id) {
        Ok(r) => r,
        Err(e) => return reject(StatusCode::BAD_REQUEST, "BAD_REQUEST_ID", e.to_string()),
    };
    // Admission control (seed §22.2, last row): refuse rather than accept
    // a reservation that would expire in the backlog.
    if let Some(why) = state.governor.closed() {
        state.governor.refused.add(1);
        return reject(
            StatusCode::SERVICE_UNAVAILABLE,
            "ADMISSION_CLOSED",
            format!("new reservations are paused: {why}"),
        );
    }
    let valid_for = match valid_for_ms(&state, activity).await {
        Ok(Some(v)) => v,
        Ok(None) => {
            return reject(
                StatusCode::NOT_FOUND,
                "UNKNOWN_ACTIVITY",
                format!("activity {activity} does not exist"),
            );
        }
        Err(e) => {
            return reject(
                StatusCode::SERVICE_UNAVAILABLE,
                "DATABASE_UNAVAILABLE",
                e.to_string(),
            );
        }
    };
    let now = chrono::Utc::now().timestamp_millis();
    let Some(valid_until_ms) = now.checked_add(valid_for) else {
        return reject(
            StatusCode::INTERNAL_SERVER_ERROR,
            "BAD_ACTIVITY_CONFIG",
            "validity window overflows",
        );
    };
    // The message_id is fixed here, before the reservation, and never changes
    // (DESIGN.md §3).
    let req = ReserveRequest {
        activity_id: activity,
        sku_id: sku,
        user_id: UserId(body.user_id),
        request_id,
        reservation_id: ReservationId::generate(),
        message_id: MessageId::generate(),
        order_id: OrderId::generate(),
        now_ms: now,
        valid_until_ms,
    };
    match state
        .store
        .reserve(&req, now + state.first_retry_after_ms)
        .await
    {
        Ok(ReserveOutcome::Reserved(r)) => {
            // If the queue is full the scanner sends it: nothing is lost.
            state
                .publisher
                .offer(order_message(&r, TraceContext::generate()));
            queued(&r)
        }
        // The same request_id must mean the same request: another user or
        // SKU reusing it is told so, never handed someone else's reservation.
        Ok(ReserveOutcome::Existing(r)) if r.user_id != req.user_id || r.sku_id != req.sku_id => {
            reject(
                StatusCode::CONFLICT,
                "REQUEST_ID_CONFLICT",
                "this request_id already belongs to another user or sku",
            )
        }
        Ok(ReserveOutcome::Existing(r)) => queued(&r),
        Ok(ReserveOutcome::SoldOut) => reject(StatusCode::CONFLICT, "SOLD_OUT", "no stock left"),
        Ok(ReserveOutcome::DuplicateUser) => reject(
            StatusCode::CONFLICT,
            "DUPLICATE_USER",
            "this user already holds a reservation in this activity",
        ),
        Ok(ReserveOutcome::NotSeeded) => reject(
            StatusCode::NOT_FOUND,
            "UNKNOWN_SKU",
            format!("sku {sku} has no stock seeded in activity {activity}"),
        ),
        Err(e) => reject(
            StatusCode::SERVICE_UNAVAILABLE,
            "REDIS_UNAVAILABLE",
            e.to_string(),
        ),
    }
}

fn queued(r: &crate::reservation::Reservation) -> Response {
    (
        StatusCode::ACCEPTED,
        Json(Queued {
            status: "QUEUED",
            reservation_id: r.reservation_id.clone(),
            order_id: r.order_id.clone(),
            message_id: r.message_id.clone(),
        }),
    )
        .into_response()
}

#[derive(Debug, Serialize)]
struct StatusView {
    reservation_id: ReservationId,
    status: String,
}

async fn reservation_status(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    let id = match ReservationId::parse(&id) {
        Ok(id) => id,
        Err(e) => return reject(StatusCode::BAD_REQUEST, "BAD_RESERVATION_ID", e.to_string()),
    };
    match crate::reservation_status::lookup(&state.pool, &state.store, &id).await {
        Ok(Some(status)) => Json(StatusView {
            reservation_id: id,
            status,
        })
        .into_response(),
        Ok(None) => reject(
            StatusCode::NOT_FOUND,
            "UNKNOWN_RESERVATION",
            format!("no reservation {id}"),
        ),
        Err(e) => reject(StatusCode::SERVICE_UNAVAILABLE, "UNAVAILABLE", e),
    }
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
struct PayBody {
    /// The payment provider's id; generated when absent.
    payment_id: Option<String>,
}

/// The pay answer: which side won (seed §19.3), and the order as it stands.
#[derive(Debug, Serialize)]
pub struct PayView {
    pub outcome: &'static str,
    pub order: Option<order::OrderRow>,
}

async fn order_pay(
    State(state): State<AppState>,
    Path(id): Path<String>,
    body: Option<Json<PayBody>>,
) -> Response {
    let id = match OrderId::parse(&id) {
        Ok(id) => id,
        Err(e) => return reject(StatusCode::BAD_REQUEST, "BAD_ORDER_ID", e.to_string()),
    };
    let payment_id = body
        .and_then(|Json(b)| b.payment_id)
        .unwrap_or_else(|| format!("pay_{}", ulid::Ulid::new()));
    if let Err(why) = order::check_payment_id(&payment_id) {
        return reject(StatusCode::BAD_REQUEST, "BAD_PAYMENT_ID", why);
    }
    match order::pay(&state.pool, &state.names, &id, &payment_id).await {
        Ok(out) => {
            let status = match &out {
                PayOutcome::Paid { .. } | PayOutcome::AlreadyPaid { .. } => StatusCode::OK,
                PayOutcome::Canceled { .. } | PayOutcome::WindowClosed { .. } => {
                    StatusCode::CONFLICT
                }
                PayOutcome::UnknownOrder => StatusCode::NOT_FOUND,
            };
            (
                status,
                Json(PayView {
                    outcome: out.label(),
                    order: out.order().cloned(),
                }),
            )
                .into_response()
        }
        Err(e) => reject(
            StatusCode::SERVICE_UNAVAILABLE,
            "UNAVAILABLE",
            e.to_string(),
        ),
    }
}

async fn order_show(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    let id = match OrderId::parse(&id) {
        Ok(id) => id,
        Err(e) => return reject(StatusCode::BAD_REQUEST, "BAD_ORDER_ID", e.to_string()),
    };
    match order::get(&state.pool, &id).await {
        Ok(Some(o)) => Json(o).into_response(),
        Ok(None) => reject(
            StatusCode::NOT_FOUND,
            "UNKNOWN_ORDER",
            format!("no order {id}"),
        ),
        Err(e) => reject(
            StatusCode::SERVICE_UNAVAILABLE,
            "UNAVAILABLE",
            e.to_string(),
        ),
    }
}

#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatsView {
    pub publish_confirmed: u64,
    pub publish_unknown: u64,
    pub publish_definite_failure: u64,
    pub publish_batches: u64,
    /// Queued past their first retry time: the scanner sent them instead.
    #[serde(default)]
    pub publish_handed_to_scanner: u64,
    pub scanner_resent: u64,
    #[serde(default)]
    pub resend: ResendView,
    pub send_latency: Percentiles,
    #[serde(default)]
    pub lifecycle: LifecycleView,
    #[serde(default)]
    pub consume: ConsumeView,
    #[serde(default)]
    pub pool: PoolView,
    #[serde(default)]
    pub governor: GovernorView,
}

/// The order-create consumer (seed §28.2). Percentiles cover the last
/// [`crate::governor::SIGNAL_WINDOW`]; sums and counts are since start.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ConsumeView {
    pub inflight: i64,
    pub acked: u64,
    pub retried: u64,
    pub created: u64,
    pub duplicates: u64,
    pub duplicate_reservation: u64,
    pub rejected_no_stock: u64,
    pub rejected_duplicate_user: u64,
    pub rejected_expired: u64,
    pub quarantined: u64,
    pub deadlocks: u64,
    pub serialization_failures: u64,
    pub process: Percentiles,
    pub process_sum_s: f64,
    pub process_count: u64,
    pub tx: Percentiles,
    pub tx_sum_s: f64,
    pub tx_count: u64,
    pub pool_wait: Percentiles,
    pub pool_wait_sum_s: f64,
    pub pool_wait_count: u64,
}

impl ConsumeView {
    pub fn of(c: &ConsumeStats) -> Self {
        let w = crate::governor::SIGNAL_WINDOW;
        Self {
            inflight: c.inflight.get(),
            acked: c.acked.get(),
            retried: c.retried.get(),
            created: c.created.get(),
            duplicates: c.duplicates.get(),
            duplicate_reservation: c.duplicate_reservation.get(),
            rejected_no_stock: c.rejected_no_stock.get(),
            rejected_duplicate_user: c.rejected_duplicate_user.get(),
            rejected_expired: c.rejected_expired.get(),
            quarantined: c.quarantined.get(),
            deadlocks: c.deadlocks.get(),
            serialization_failures: c.serialization_failures.get(),
            process: c.process_latency.recent(w),
            process_sum_s: c.process_latency.total_seconds(),
            process_count: c.process_latency.total_count(),
            tx: c.tx_latency.recent(w),
            tx_sum_s: c.tx_latency.total_seconds(),
            tx_count: c.tx_latency.total_count(),
            pool_wait: c.pool_wait.recent(w),
            pool_wait_sum_s: c.pool_wait.total_seconds(),
            pool_wait_count: c.pool_wait.total_count(),
        }
    }
}

/// Scanner re-sends by outcome.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct ResendView {
    pub confirmed: u64,
    pub unknown: u64,
    pub definite_failure: u64,
    pub expired: u64,
}

/// The engine's PostgreSQL pool.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct PoolView {
    pub size: u32,
    pub idle: u32,
    pub max: u32,
}

/// Admission control and the adaptive concurrency (DESIGN.md §10).
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct GovernorView {
    pub admission_open: bool,
    pub admission_reason: Option<String>,
    pub admission_trips: u64,
    pub admission_recoveries: u64,
    pub admission_refused: u64,
    pub limit: u32,
    pub budget: u32,
}

impl GovernorView {
    pub fn of(g: &Governor) -> Self {
        let a = g.admission();
        Self {
            admission_open: a.is_open(),
            admission_reason: match a.gate {
                crate::admission::Gate::Open => None,
                crate::admission::Gate::Closed { reason, .. } => Some(reason),
            },
            admission_trips: a.trips,
            admission_recoveries: a.recoveries,
            admission_refused: g.refused.get(),
            limit: g.limiter.limit(),
            budget: g.limiter.budget(),
        }
    }
}

/// After-order counters (DESIGN.md §8), cancel no-ops by reason.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct LifecycleView {
    pub outbox_sent: u64,
    pub outbox_unknown: u64,
    pub outbox_failed: u64,
    pub canceled: u64,
    pub cancel_noop_already_paid: u64,
    pub cancel_noop_already_canceled: u64,
    pub cancel_noop_not_yet_due: u64,
    pub cancel_noop_unknown_order: u64,
    pub released: u64,
    pub already_released: u64,
    pub orphaned: u64,
    pub projected: u64,
    pub projection_stale: u64,
    pub sweep_canceled: u64,
    pub sweep_released: u64,
}

impl LifecycleView {
    pub fn of(s: &LifecycleStats) -> Self {
        Self {
            outbox_sent: s.outbox_sent.get(),
            outbox_unknown: s.outbox_unknown.get(),
            outbox_failed: s.outbox_failed.get(),
            canceled: s.canceled.get(),
            cancel_noop_already_paid: s.cancel_noop_already_paid.get(),
            cancel_noop_already_canceled: s.cancel_noop_already_canceled.get(),
            cancel_noop_not_yet_due: s.cancel_noop_not_yet_due.get(),
            cancel_noop_unknown_order: s.cancel_noop_unknown_order.get(),
            released: s.released.get(),
            already_released: s.already_released.get(),
            orphaned: s.orphaned.get(),
            projected: s.projected.get(),
            projection_stale: s.projection_stale.get(),
            sweep_canceled: s.sweep_canceled.get(),
            sweep_released: s.sweep_released.get(),
        }
    }
}

impl StatsView {
    pub fn of(
        s: &PublishStats,
        l: &LifecycleStats,
        c: &ConsumeStats,
        pool: &PgPool,
        g: &Governor,
    ) -> Self {
        Self {
            lifecycle: LifecycleView::of(l),
            consume: ConsumeView::of(c),
            pool: PoolView {
                size: pool.size(),
                idle: pool.num_idle() as u32,
                max: pool.options().get_max_connections(),
            },
            governor: GovernorView::of(g),
            publish_confirmed: s.confirmed.get(),
            publish_unknown: s.unknown.get(),
            publish_definite_failure: s.definite_failure.get(),
            publish_batches: s.batches.get(),
            publish_handed_to_scanner: s.handed_to_scanner.get(),
            scanner_resent: s.resent.get(),
            resend: ResendView {
                confirmed: s.resend_confirmed.get(),
                unknown: s.resend_unknown.get(),
                definite_failure: s.resend_failed.get(),
                expired: s.resend_expired.get(),
            },
            send_latency: s.send_latency.percentiles(),
        }
    }
}

impl AppState {
    pub fn stats_view(&self) -> StatsView {
        StatsView::of(
            &self.stats,
            &self.lifecycle,
            &self.consume,
            &self.pool,
            &self.governor,
        )
    }
}

async fn stats(State(state): State<AppState>) -> Json<StatsView> {
    Json(state.stats_view())
}

/// Prometheus text format (seed §28.2 names).
async fn metrics(State(state): State<AppState>) -> Response {
    let body = crate::metrics::render(&crate::metrics::MetricsInput {
        topic: state.names.topic(crate::mq::TopicKind::OrderCreate),
        stats: &state.stats_view(),
        publish_latency: &state.stats.send_latency,
        tick: state.governor.last().as_deref(),
    });
    (
        [(
            axum::http::header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        body,
    )
        .into_response()
}

async fn readyz(State(state): State<AppState>) -> Response {
    if !state.ready.load(Ordering::Relaxed) {
        (StatusCode::SERVICE_UNAVAILABLE, "not ready: shutting down").into_response()
    } else if !state.consuming.load(Ordering::Acquire) {
        (
            StatusCode::SERVICE_UNAVAILABLE,
            "not ready: the order consumer has no queues yet",
        )
            .into_response()
    } else {
        (StatusCode::OK, "ready").into_response()
    }
}
