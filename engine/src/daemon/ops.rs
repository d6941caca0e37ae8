//! The operator API (docs/security.md): the CLI's and the TUI's mutations,
//! behind the token gate (role operator), each calling the same library
//! function the `--direct` path calls, with the request's [`Actor`] so the
//! audit row names the token. Bad input is a 400 before anything is
//! touched; a refusal of the domain (a ticket move the lifecycle forbids,
//! an entry that cannot be discarded) is a 409 with its reason.

use crate::daemon::api::{CancelBody, DiscardBody, PayView, TicketBody};
use crate::daemon::state::{AppState, reject};
use crate::dlq::discard::{DiscardError, DiscardRequest, discard as discard_entry};
use crate::dlq::tickets::{self, ApplyError, TicketAction, TicketError};
use crate::domain::auth::Actor;
use crate::domain::ids::{OrderId, TicketId};
use crate::pipeline::order::{self, CancelOutcome};
use axum::Json;
use axum::extract::rejection::JsonRejection;
use axum::extract::{Extension, Path, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};

fn unavailable(e: impl std::fmt::Display) -> Response {
    reject(
        StatusCode::SERVICE_UNAVAILABLE,
        "UNAVAILABLE",
        e.to_string(),
    )
}

fn bad_body(e: JsonRejection) -> Response {
    reject(StatusCode::BAD_REQUEST, "BAD_BODY", e.body_text())
}

/// `POST /v1/ops/orders/{id}/cancel`.
pub(super) async fn order_cancel(
    State(state): State<AppState>,
    Extension(actor): Extension<Actor>,
    Path(id): Path<String>,
    body: Result<Json<CancelBody>, JsonRejection>,
) -> Response {
    let id = match OrderId::parse(&id) {
        Ok(id) => id,
        Err(e) => return reject(StatusCode::BAD_REQUEST, "BAD_ORDER_ID", e.to_string()),
    };
    let body = match body {
        Ok(Json(b)) => b,
        Err(e) => return bad_body(e),
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
    body: Result<Json<TicketBody>, JsonRejection>,
) -> Response {
    let id = match id.parse::<TicketId>() {
        Ok(id) => id,
        Err(e) => return reject(StatusCode::BAD_REQUEST, "BAD_TICKET_ID", e.to_string()),
    };
    let action = match body {
        Ok(Json(b)) => action_of(b),
        Err(e) => return bad_body(e),
    };
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
    body: Result<Json<DiscardBody>, JsonRejection>,
) -> Response {
    let body = match body {
        Ok(Json(b)) => b,
        Err(e) => return bad_body(e),
    };
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
