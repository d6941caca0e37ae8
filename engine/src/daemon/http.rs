//! The daemon's HTTP surface (docs/architecture.md §13): reservation ingress, status
//! query, liveness, readiness and stats, each behind the token gate of
//! docs/security.md except the probes. Handlers validate everything before
//! touching Redis: a malformed request gets a 4xx with a reason and writes
//! nothing.

use crate::config::HttpConfig;
use crate::daemon::api::{MAX_VERIFY_MS, PayBody, PayView, Queued, ReserveBody, StatusView};
use crate::daemon::auth::{self, Gate};
use crate::daemon::body::{JsonBody, MaybeJsonBody};
use crate::daemon::limits::{self, Limits};
use crate::daemon::ops;
pub use crate::daemon::state::AppState;
use crate::daemon::state::reject;
use crate::domain::auth::{Actor, Need};
use crate::domain::ids::{ActivityId, OrderId, RequestId, ReservationId, SkuId, UserId};
use crate::domain::stats::StatsView;
use crate::domain::trace::parse_traceparent;
use crate::pipeline::ingress::{Refusal, ReserveCall};
use crate::pipeline::order::{self, PayOutcome};
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::middleware;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use axum::{Json, Router};
use std::sync::Arc;
use std::sync::atomic::Ordering;

/// The API: every route behind the gate, grouped by what it needs
/// (docs/security.md, "Roles"), and inside the limits of `[http]`
/// (docs/architecture.md §13.2): the public routes answer within
/// `request_timeout_ms`; the operator API, which holds a request while a
/// replay verifies or a restore drains, within its own cap. Both count
/// against one bound of requests in flight.
pub fn router(state: AppState, gate: Arc<Gate>, http: &HttpConfig) -> Router {
    let needs = |need: Need| middleware::from_fn_with_state((gate.clone(), need), auth::guard);
    let api = Limits::api(http);
    let ops_limits = api.with_timeout(std::time::Duration::from_millis(MAX_VERIFY_MS + 60_000));
    let within = |l: Limits| middleware::from_fn_with_state(l, limits::enforce);
    let public = Router::new()
        .merge(
            Router::new()
                .route(
                    "/v1/activities/{activity}/skus/{sku}/reservations",
                    post(reserve),
                )
                .route_layer(needs(Need::Reserve)),
        )
        .merge(
            Router::new()
                .route("/v1/reservations/{id}", get(reservation_status))
                .route("/v1/orders/{id}", get(order_show))
                .route_layer(needs(Need::Status)),
        )
        .merge(
            Router::new()
                .route("/v1/orders/{id}/pay", post(order_pay))
                .route_layer(needs(Need::Pay)),
        )
        .merge(
            Router::new()
                .route("/v1/stats", get(stats))
                .route_layer(needs(Need::Read)),
        )
        .route_layer(within(api));
    let operator = Router::new()
        .merge(
            Router::new()
                .route("/v1/ops/orders/{id}/cancel", post(ops::order_cancel))
                .route("/v1/ops/tickets/{id}", post(ops::ticket_move))
                .route("/v1/ops/dlq/discard", post(ops::discard))
                .route("/v1/ops/dlq/replay", post(ops::replay_one))
                .route("/v1/ops/dlq/rehearse", post(ops::rehearse))
                .route("/v1/ops/tickets/{id}/replay", post(ops::replay_ticket))
                .route("/v1/ops/activities", post(ops::activity_create))
                .route("/v1/ops/activities/{id}/end", post(ops::activity_end))
                .route(
                    "/v1/ops/quarantine/{id}/discard",
                    post(ops::quarantine_discard),
                )
                .route_layer(needs(Need::Operate)),
        )
        .merge(
            Router::new()
                .route(
                    "/v1/ops/activities/{id}/restore",
                    post(ops::activity_restore),
                )
                .route_layer(needs(Need::Administer)),
        )
        .route_layer(within(ops_limits));
    public
        .merge(operator)
        .layer(Extension(crate::daemon::body::BodyCap(http.max_body_bytes)))
        .with_state(state)
}

/// Liveness, readiness and metrics: open, for probes and scrapers, on the
/// API's address or on `--admin-listen`'s.
pub fn admin_router(state: AppState) -> Router {
    Router::new()
        .route("/metrics", get(metrics))
        .route("/healthz", get(|| async { "ok" }))
        .route("/readyz", get(readyz))
        .with_state(state)
}

/// Parses and validates the request, then hands it to [`Ingress`]; every
/// refusal maps to one status code. Nothing is written before the request
/// is known to be well formed.
async fn reserve(
    State(state): State<AppState>,
    Path((activity, sku)): Path<(String, String)>,
    headers: axum::http::HeaderMap,
    JsonBody(body): JsonBody<ReserveBody>,
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
    // Admission control (docs/architecture.md §10.8, last row): refuse rather than accept
    // a reservation that would expire in the backlog.
    if let Some(why) = state.governor.closed() {
        state.governor.refused.add(1);
        return reject(
            StatusCode::SERVICE_UNAVAILABLE,
            "ADMISSION_CLOSED",
            format!("new reservations are paused: {why}"),
        );
    }
    let call = ReserveCall {
        activity,
        sku,
        user: UserId(body.user_id),
        request_id,
        trace: headers
            .get("traceparent")
            .and_then(|h| h.to_str().ok())
            .and_then(parse_traceparent),
    };
    match state.ingress.reserve(call).await {
        Ok(r) => (
            StatusCode::ACCEPTED,
            Json(Queued {
                status: "QUEUED".to_owned(),
                reservation_id: r.reservation_id,
                order_id: r.order_id,
                message_id: r.message_id,
                trace_id: Some(r.trace_id),
            }),
        )
            .into_response(),
        Err(refusal) => {
            let status = match &refusal {
                Refusal::UnknownActivity(_) | Refusal::UnknownSku { .. } => StatusCode::NOT_FOUND,
                Refusal::DatabaseUnavailable(_)
                | Refusal::RedisUnavailable(_)
                | Refusal::RedisStateLost(_) => StatusCode::SERVICE_UNAVAILABLE,
                Refusal::BadActivityConfig(_) => StatusCode::INTERNAL_SERVER_ERROR,
                Refusal::RequestIdConflict | Refusal::SoldOut | Refusal::DuplicateUser => {
                    StatusCode::CONFLICT
                }
                // Gone for good: a client should stop retrying (§16.3).
                Refusal::ActivityEnded(_) => StatusCode::GONE,
            };
            reject(status, refusal.code(), refusal.to_string())
        }
    }
}

async fn reservation_status(State(state): State<AppState>, Path(id): Path<String>) -> Response {
    let id = match ReservationId::parse(&id) {
        Ok(id) => id,
        Err(e) => return reject(StatusCode::BAD_REQUEST, "BAD_RESERVATION_ID", e.to_string()),
    };
    match crate::ops::reservation_status::lookup(&state.pool, &state.store, &id).await {
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
        Err(e) => reject(
            StatusCode::SERVICE_UNAVAILABLE,
            "UNAVAILABLE",
            e.to_string(),
        ),
    }
}

/// The payment provider's callback (role `payments`, docs/security.md):
/// audited like every other mutation.
async fn order_pay(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Path(id): Path<String>,
    MaybeJsonBody(body): MaybeJsonBody<PayBody>,
) -> Response {
    let id = match OrderId::parse(&id) {
        Ok(id) => id,
        Err(e) => return reject(StatusCode::BAD_REQUEST, "BAD_ORDER_ID", e.to_string()),
    };
    // No body is a payment without an id of its own; a body that does not
    // parse is refused (by the extractor), never taken for no body.
    let payment_id = body
        .and_then(|b| b.payment_id)
        .unwrap_or_else(|| format!("pay_{}", ulid::Ulid::new()));
    if let Err(why) = order::check_payment_id(&payment_id) {
        return reject(StatusCode::BAD_REQUEST, "BAD_PAYMENT_ID", why);
    }
    match order::pay(&state.pool, &state.names, &id, &payment_id, &actor).await {
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
                    outcome: out.label().to_owned(),
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

async fn stats(State(state): State<AppState>) -> Json<StatsView> {
    Json(state.stats_view())
}

/// Prometheus text format (docs/architecture.md §11.1 names).
async fn metrics(State(state): State<AppState>) -> Response {
    use crate::daemon::metrics::{CONTENT_TYPE, Parts, Scrape, readiness, render};
    let tick = state.governor.last();
    let ready = readiness(tick.as_deref(), &state.positions, &state.meters);
    let body = render(Parts {
        meters: &state.meters,
        order_tx: state.consume.tx_latency.histogram(),
        pool_wait: state.consume.pool_wait.histogram(),
        scrape: Scrape {
            names: state.names.clone(),
            stats: state.stats_view(),
            tick,
            redis_unreplicated: state.store.unreplicated(),
            ready,
        },
    });
    ([(axum::http::header::CONTENT_TYPE, CONTENT_TYPE)], body).into_response()
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
