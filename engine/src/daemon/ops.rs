//! The operator API (docs/security.md §6): the CLI's and the TUI's
//! mutations, behind the token gate (role operator; a restore and a forced
//! re-seed the admin's), each calling the same library function the
//! `--direct` path calls, with the request's [`Actor`] so the audit row
//! names the token. Bad input is a 400 before anything is touched; a
//! refusal of the domain (a ticket move the lifecycle forbids, an entry
//! that cannot be discarded, a restore of an intact activity) is a 409
//! with its reason. Replays, ticket replays and restores hold the request
//! while they wait, never longer than [`MAX_VERIFY_MS`].

use crate::daemon::api::{
    ActivityBody, CancelBody, DiscardBody, EndBody, MAX_VERIFY_MS, PayView, QuarantineDiscardBody,
    RehearseBody, ReplayBody, RestoreBody, TicketBody, TicketReplayBody,
};
use crate::daemon::auth::decide;
use crate::daemon::body::JsonBody;
use crate::daemon::state::{AppState, reject};
use crate::dlq::discard::{DiscardError, DiscardRequest, discard as discard_entry};
use crate::dlq::replay::{self, BulkRequest, RehearseError, ReplayError, ReplayRequest};
use crate::dlq::tickets::{self, ApplyError, TicketAction, TicketError};
use crate::domain::auth::{Actor, Need};
use crate::domain::ids::{ActivityId, OrderId, TicketId};
use crate::mq::rocket::RocketAdmin;
use crate::ops::activity::{self, ActivityError};
use crate::ops::quarantine::{self, QuarantineError};
use crate::ops::redis_state::{RedisStateError, RestoreRequest};
use crate::ops::restore::{RestoreError, RestoreOn, restore_audited};
use crate::pipeline::order::{self, CancelOutcome};
use axum::Json;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use std::time::Duration;

fn unavailable(e: impl std::fmt::Display) -> Response {
    reject(
        StatusCode::SERVICE_UNAVAILABLE,
        "UNAVAILABLE",
        e.to_string(),
    )
}

/// `POST /v1/ops/orders/{id}/cancel`.
pub(super) async fn order_cancel(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<CancelBody>,
) -> Response {
    let id = match OrderId::parse(&id) {
        Ok(id) => id,
        Err(e) => return reject(StatusCode::BAD_REQUEST, "BAD_ORDER_ID", e.to_string()),
    };
    let reason = body.reason.trim();
    if reason.is_empty() {
        return reject(
            StatusCode::BAD_REQUEST,
            "NO_REASON",
            "reason must not be empty",
        );
    }
    let reason = format!("OPERATOR: {reason}");
    match order::cancel_by(&state.pool, &state.names, &id, &reason, &actor).await {
        Ok(CancelOutcome::Canceled { order }) => Json(PayView {
            outcome: "CANCELED".into(),
            order: Some(*order),
        })
        .into_response(),
        Ok(CancelOutcome::NoOp { order: None, .. }) => reject(
            StatusCode::NOT_FOUND,
            "UNKNOWN_ORDER",
            format!("no order {id}"),
        ),
        Ok(CancelOutcome::NoOp {
            reason,
            order: Some(order),
        }) => (
            StatusCode::CONFLICT,
            Json(PayView {
                outcome: format!("NOOP_{}", reason.as_str()),
                order: Some(*order),
            }),
        )
            .into_response(),
        Err(e) => unavailable(e),
    }
}

/// `POST /v1/ops/tickets/{id}` with `{"action": "ack" | "assign" | ...}`.
pub(super) async fn ticket_move(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Path(id): Path<String>,
    JsonBody(body): JsonBody<TicketBody>,
) -> Response {
    let id = match id.parse::<TicketId>() {
        Ok(id) => id,
        Err(e) => return reject(StatusCode::BAD_REQUEST, "BAD_TICKET_ID", e.to_string()),
    };
    let action = action_of(body);
    match tickets::apply(&state.pool, &id, &action, &actor).await {
        Ok(t) => Json(t).into_response(),
        Err(ApplyError::Ticket(e)) => {
            let (status, code) = match &e {
                TicketError::Unknown(_) => (StatusCode::NOT_FOUND, "UNKNOWN_TICKET"),
                TicketError::Empty(_) => (StatusCode::BAD_REQUEST, "EMPTY_FIELD"),
                TicketError::Refused { .. } | TicketError::Unsettled { .. } => {
                    (StatusCode::CONFLICT, "REFUSED")
                }
            };
            reject(status, code, e.to_string())
        }
        Err(ApplyError::Db(e)) => unavailable(e),
    }
}

fn action_of(b: TicketBody) -> TicketAction {
    match b {
        TicketBody::Ack => TicketAction::Ack,
        TicketBody::Assign { owner } => TicketAction::Assign { owner },
        TicketBody::Resolve => TicketAction::Resolve,
        TicketBody::Close { resolution, force } => TicketAction::Close { resolution, force },
    }
}

/// `POST /v1/ops/dlq/discard`.
pub(super) async fn discard(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    JsonBody(body): JsonBody<DiscardBody>,
) -> Response {
    let req = DiscardRequest {
        message_id: body.message_id,
        group: body.group,
        reason: body.reason,
        actor,
    };
    match discard_entry(&state.pool, &state.names, &req).await {
        Ok(r) => Json(r).into_response(),
        Err(DiscardError::Db(e)) => unavailable(e),
        Err(e) => {
            let (status, code) = match &e {
                DiscardError::NoReason => (StatusCode::BAD_REQUEST, "NO_REASON"),
                DiscardError::Unknown(_) => (StatusCode::NOT_FOUND, "UNKNOWN_MESSAGE"),
                DiscardError::Ambiguous { .. } => (StatusCode::BAD_REQUEST, "AMBIGUOUS"),
                _ => (StatusCode::CONFLICT, "REFUSED"),
            };
            reject(status, code, e.to_string())
        }
    }
}

/// A replay's refusal: bad input 400, an unknown id 404, a closed ticket
/// 409, PostgreSQL 503 (the CLI's `--direct` path says the same words).
fn replay_refused(e: ReplayError) -> Response {
    let (status, code) = match &e {
        ReplayError::Db(e) => return unavailable(e),
        ReplayError::Unknown(_) => (StatusCode::NOT_FOUND, "UNKNOWN_MESSAGE"),
        ReplayError::UnknownTicket(_) => (StatusCode::NOT_FOUND, "UNKNOWN_TICKET"),
        ReplayError::ClosedTicket(_) => (StatusCode::CONFLICT, "REFUSED"),
        ReplayError::NoReason => (StatusCode::BAD_REQUEST, "NO_REASON"),
        ReplayError::Ambiguous { .. } => (StatusCode::BAD_REQUEST, "AMBIGUOUS"),
        ReplayError::NotForceable(_) => (StatusCode::BAD_REQUEST, "NOT_FORCEABLE"),
        ReplayError::BadRate(_) => (StatusCode::BAD_REQUEST, "BAD_RATE"),
    };
    reject(status, code, e.to_string())
}

/// A wait a body asked for, past the operator API's cap.
struct TooLong(u64);

impl TooLong {
    fn response(self) -> Response {
        reject(
            StatusCode::BAD_REQUEST,
            "BAD_WAIT",
            format!(
                "a wait of {} ms is over the operator API's cap of {MAX_VERIFY_MS} ms",
                self.0
            ),
        )
    }
}

/// The wait a body asks for, unless it is past the cap.
fn verify_wait(ms: u64) -> Result<Duration, TooLong> {
    if ms > MAX_VERIFY_MS {
        return Err(TooLong(ms));
    }
    Ok(Duration::from_millis(ms))
}

/// `POST /v1/ops/dlq/replay`: one dead message, the same guarded replay
/// as `dlq replay --direct`, sent on the engine's producer.
pub(super) async fn replay_one(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    JsonBody(b): JsonBody<ReplayBody>,
) -> Response {
    let verify_within = match verify_wait(b.verify_within_ms) {
        Ok(d) => d,
        Err(e) => return e.response(),
    };
    let req = ReplayRequest {
        message_id: b.message_id,
        group: b.group,
        reason: b.reason,
        actor,
        dry_run: b.dry_run,
        force: b.force,
        verify_within,
        include_replayed: b.include_replayed,
        retention: state.ops.retention,
    };
    match replay::replay(&state.pool, &state.names, &state.ops.producer, &req).await {
        Ok(r) => Json(r).into_response(),
        Err(e) => replay_refused(e),
    }
}

/// `POST /v1/ops/tickets/{id}/replay`: a ticket's DEAD entries, canaries
/// first; the request is held for the whole run, as the CLI's is.
pub(super) async fn replay_ticket(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<TicketReplayBody>,
) -> Response {
    let ticket = match id.parse::<TicketId>() {
        Ok(id) => id,
        Err(e) => return reject(StatusCode::BAD_REQUEST, "BAD_TICKET_ID", e.to_string()),
    };
    let verify_within = match verify_wait(b.verify_within_ms) {
        Ok(d) => d,
        Err(e) => return e.response(),
    };
    let req = BulkRequest {
        ticket,
        reason: b.reason,
        actor,
        dry_run: b.dry_run,
        force: b.force,
        rate_per_s: b.rate_per_s,
        canary: b.canary,
        verify_within,
        include_replayed: b.include_replayed,
        retention: state.ops.retention,
    };
    match replay::replay_ticket(&state.pool, &state.names, &state.ops.producer, &req).await {
        Ok(r) => Json(r).into_response(),
        Err(e) => replay_refused(e),
    }
}

/// `POST /v1/ops/dlq/rehearse`: the consumer's transaction, rolled back.
pub(super) async fn rehearse(
    State(state): State<AppState>,
    JsonBody(b): JsonBody<RehearseBody>,
) -> Response {
    match replay::rehearse(&state.pool, &state.names, &b.message_id, b.group.as_deref()).await {
        Ok(r) => Json(r).into_response(),
        Err(RehearseError::Replay(e)) => replay_refused(e),
        Err(RehearseError::Db(e)) => unavailable(e),
        Err(e @ (RehearseError::NotOrderCreate { .. } | RehearseError::Malformed(_))) => {
            reject(StatusCode::BAD_REQUEST, "NOT_REHEARSABLE", e.to_string())
        }
    }
}

/// `POST /v1/ops/activities`: seed an activity (operator); re-seeding one
/// with `force` is the admin's (docs/security.md, "Roles"), checked here
/// because the route's gate cannot see the body.
pub(super) async fn activity_create(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    JsonBody(b): JsonBody<ActivityBody>,
) -> Response {
    if b.force
        && let Err(denied) = decide(&actor.name, actor.role, Need::Administer)
    {
        tracing::warn!(
            route = "/v1/ops/activities",
            token = actor.name,
            status = 403,
            "refused: a forced re-seed needs an admin"
        );
        return (denied.status(), Json(denied.body())).into_response();
    }
    let a = b.new_activity();
    match activity::create_audited(&state.pool, &state.store, &a, b.reason.as_deref(), &actor).await
    {
        Ok(v) => Json(v).into_response(),
        Err(e) => activity_refused(e),
    }
}

fn activity_refused(e: ActivityError) -> Response {
    let (status, code) = match &e {
        ActivityError::Db(_) | ActivityError::Redis(_) => return unavailable(e),
        ActivityError::NotFound(_) => (StatusCode::NOT_FOUND, "UNKNOWN_ACTIVITY"),
        ActivityError::AlreadyExists { .. }
        | ActivityError::HasOrders { .. }
        | ActivityError::LiveReservations { .. } => (StatusCode::CONFLICT, "REFUSED"),
        ActivityError::NoReason | ActivityError::EndNeedsReason => {
            (StatusCode::BAD_REQUEST, "NO_REASON")
        }
        ActivityError::BadStock(_) | ActivityError::BadWindow { .. } | ActivityError::BadEnd(_) => {
            (StatusCode::BAD_REQUEST, "BAD_FIGURES")
        }
        ActivityError::Ended { .. } => (StatusCode::CONFLICT, "ENDED"),
    };
    reject(status, code, e.to_string())
}

/// `POST /v1/ops/activities/{id}/end` (operator): ends the sale now or
/// `in_ms` from now (docs/architecture.md §16.3); the answer is an `EndView`.
pub(super) async fn activity_end(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<EndBody>,
) -> Response {
    let Ok(activity) = id.parse::<ActivityId>() else {
        return reject(
            StatusCode::BAD_REQUEST,
            "BAD_ACTIVITY_ID",
            "activity id must be a positive integer",
        );
    };
    let within = Duration::from_millis(b.in_ms);
    match activity::end_audited(&state.pool, activity, within, &b.reason, &actor).await {
        Ok(v) => Json(v).into_response(),
        Err(e) => activity_refused(e),
    }
}

/// `POST /v1/ops/activities/{id}/restore` (admin): the restore of
/// docs/architecture.md §4.5, held until the order backlog drained.
pub(super) async fn activity_restore(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<RestoreBody>,
) -> Response {
    let Ok(activity) = id.parse::<ActivityId>() else {
        return reject(
            StatusCode::BAD_REQUEST,
            "BAD_ACTIVITY_ID",
            "activity id must be a positive integer",
        );
    };
    let wait = match verify_wait(b.wait_ms) {
        Ok(d) => d,
        Err(e) => return e.response(),
    };
    let admin = match RocketAdmin::start(
        state.ops.rt.clone(),
        &state.ops.namesrv,
        state.ops.admin_timeout,
    )
    .await
    {
        Ok(a) => a,
        Err(e) => return unavailable(e),
    };
    let req = RestoreRequest {
        activity,
        operator: actor.name.clone(),
        reason: b.reason,
    };
    let on = RestoreOn {
        pool: &state.pool,
        store: &state.store,
        admin: &admin,
        names: &state.names,
    };
    let done = restore_audited(&on, &req, &actor, wait, &|left| {
        tracing::info!(%activity, left, "restore waits for the order consumer's backlog");
    })
    .await;
    admin.shutdown().await;
    match done {
        Ok(r) => Json(r).into_response(),
        Err(e) => {
            let (status, code) = match &e {
                RestoreError::Db(_) | RestoreError::Mq(_) => return unavailable(e),
                RestoreError::State(RedisStateError::Db(_) | RedisStateError::Redis(_)) => {
                    return unavailable(e);
                }
                RestoreError::State(RedisStateError::BlankReason) => {
                    (StatusCode::BAD_REQUEST, "NO_REASON")
                }
                RestoreError::State(RedisStateError::NotSeeded(_)) => {
                    (StatusCode::NOT_FOUND, "UNKNOWN_ACTIVITY")
                }
                RestoreError::State(RedisStateError::Intact { .. }) => {
                    (StatusCode::CONFLICT, "INTACT")
                }
                RestoreError::State(RedisStateError::Retired(_)) => {
                    (StatusCode::CONFLICT, "RETIRED")
                }
                RestoreError::NotDrained { .. } => (StatusCode::CONFLICT, "NOT_DRAINED"),
            };
            reject(status, code, e.to_string())
        }
    }
}

/// `POST /v1/ops/quarantine/{id}/discard`: one quarantined message marked
/// discarded, audited under the token.
pub(super) async fn quarantine_discard(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Path(id): Path<String>,
    JsonBody(b): JsonBody<QuarantineDiscardBody>,
) -> Response {
    let Ok(id) = id.parse::<i64>() else {
        return reject(
            StatusCode::BAD_REQUEST,
            "BAD_QUARANTINE_ID",
            "a quarantine id is the integer `seckillctl quarantine list` shows",
        );
    };
    match quarantine::discard(&state.pool, id, &b.reason, &actor).await {
        Ok(row) => Json(row).into_response(),
        Err(QuarantineError::Db(e)) => unavailable(e),
        Err(e) => {
            let (status, code) = match &e {
                QuarantineError::Unknown(_) => (StatusCode::NOT_FOUND, "UNKNOWN_QUARANTINE"),
                QuarantineError::NoReason => (StatusCode::BAD_REQUEST, "NO_REASON"),
                _ => (StatusCode::CONFLICT, "REFUSED"),
            };
            reject(status, code, e.to_string())
        }
    }
}
