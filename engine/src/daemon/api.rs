//! The bodies of the daemon's HTTP API (docs/architecture.md §13), public so
//! the CLI, the bench and the tests read and write the same types the
//! handlers do.

use crate::dlq::replay::Check;
use crate::domain::ids::{ActivityId, MessageId, OrderId, ReservationId, SkuId};
use crate::domain::trace::TraceId;
use crate::ops::reservation_status::ReservationStatus;
use crate::pipeline::order::OrderRow;
use serde::{Deserialize, Serialize};

/// `POST /v1/activities/{a}/skus/{s}/reservations`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReserveBody {
    pub user_id: i64,
    pub request_id: String,
}

/// `202 QUEUED`: the reservation and the ids it will carry to the end.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Queued {
    pub status: String,
    pub reservation_id: ReservationId,
    pub order_id: OrderId,
    pub message_id: MessageId,
    /// The reservation's W3C trace (docs/architecture.md §11.5).
    #[serde(default)]
    pub trace_id: Option<TraceId>,
}

/// Every 4xx and 5xx: a stable code and a reason for people.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct ApiError {
    pub error: String,
    pub reason: String,
    /// The same request may succeed later, unchanged (every 503).
    #[serde(default)]
    pub retryable: bool,
}

/// `GET /v1/reservations/{id}`.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StatusView {
    pub reservation_id: ReservationId,
    pub status: ReservationStatus,
}

/// `POST /v1/orders/{id}/pay`.
#[derive(Debug, Default, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PayBody {
    /// The payment provider's id; generated when absent.
    pub payment_id: Option<String>,
}

/// The pay answer: which side won (docs/architecture.md §8), and the order
/// as it stands.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct PayView {
    pub outcome: String,
    pub order: Option<OrderRow>,
}

/// `POST /v1/ops/orders/{id}/cancel` (role operator): an operator's cancel,
/// now (docs/architecture.md §8.3).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CancelBody {
    pub reason: String,
}

/// `POST /v1/ops/tickets/{id}` (role operator): one ticket move.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "action", rename_all = "lowercase", deny_unknown_fields)]
pub enum TicketBody {
    Ack,
    Assign {
        owner: String,
    },
    Resolve,
    Close {
        resolution: String,
        #[serde(default)]
        force: bool,
    },
}

/// `POST /v1/ops/dlq/discard` (role operator): end one dead message
/// without its effect (docs/architecture.md §9.2).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DiscardBody {
    pub message_id: MessageId,
    #[serde(default)]
    pub group: Option<String>,
    pub reason: String,
}

/// `POST /v1/ops/dlq/replay` (role operator): one dead message, re-sent
/// with its original `message_id` after the pre-checks
/// (docs/architecture.md §9.3–9.5); the answer is a `ReplayReport`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReplayBody {
    pub message_id: MessageId,
    #[serde(default)]
    pub group: Option<String>,
    pub reason: String,
    #[serde(default)]
    pub dry_run: bool,
    #[serde(default)]
    pub force: Vec<Check>,
    /// How long to wait for the consumer's verdict; at most
    /// [`MAX_VERIFY_MS`].
    pub verify_within_ms: u64,
    #[serde(default)]
    pub include_replayed: bool,
}

/// `POST /v1/ops/tickets/{id}/replay` (role operator): every DEAD entry
/// of a ticket, canaries first, then the rest at the rate; the answer is a
/// `BulkReport`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TicketReplayBody {
    pub reason: String,
    #[serde(default)]
    pub dry_run: bool,
    #[serde(default)]
    pub force: Vec<Check>,
    pub rate_per_s: f64,
    pub canary: usize,
    pub verify_within_ms: u64,
    #[serde(default)]
    pub include_replayed: bool,
}

/// The longest verify wait the operator API holds a request for: a body
/// cannot park a handler for longer than an operator would wait.
pub const MAX_VERIFY_MS: u64 = 10 * 60 * 1000;

/// `POST /v1/ops/dlq/rehearse` (role operator): the order consumer's
/// transaction for one dead message, rolled back; the answer is a
/// `Rehearsal`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RehearseBody {
    pub message_id: MessageId,
    #[serde(default)]
    pub group: Option<String>,
}

/// `POST /v1/ops/activities` (role operator; admin with `force`): seed an
/// activity's stock on both sides; the answer is an `ActivityView`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ActivityBody {
    pub activity: ActivityId,
    pub sku: SkuId,
    pub stock: i64,
    pub valid_for_ms: i64,
    pub pay_within_ms: i64,
    #[serde(default)]
    pub force: bool,
    #[serde(default)]
    pub reason: Option<String>,
}

/// `POST /v1/ops/activities/{id}/end` (role operator): stop the sale's
/// reservations `in_ms` from now (0: now); the answer is an `EndView`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EndBody {
    #[serde(default)]
    pub in_ms: u64,
    pub reason: String,
}

impl ActivityBody {
    /// The seeding this body asks for; the reason goes to the audit row.
    pub fn new_activity(&self) -> crate::ops::activity::NewActivity {
        crate::ops::activity::NewActivity {
            activity: self.activity,
            sku: self.sku,
            stock: self.stock,
            valid_for_ms: self.valid_for_ms,
            pay_within_ms: self.pay_within_ms,
            force: self.force,
        }
    }
}

/// `POST /v1/ops/activities/{id}/restore` (role admin): rebuild an
/// activity's Redis state from PostgreSQL once the order backlog drained;
/// the answer is a `RestoreReport`.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RestoreBody {
    pub reason: String,
    /// How long to wait for the order consumer's backlog; at most
    /// [`MAX_VERIFY_MS`].
    pub wait_ms: u64,
}

/// `POST /v1/ops/quarantine/{id}/discard` (role operator): mark one
/// quarantined message discarded, saying why; the answer is the row after.
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct QuarantineDiscardBody {
    pub reason: String,
}

/// An answer of the operator API: its status and JSON body (a 2xx, or a
/// 4xx the caller maps to its own words).
#[derive(Debug, Clone)]
pub struct OpReply {
    pub status: u16,
    pub body: serde_json::Value,
}

impl OpReply {
    /// The body as `T`: a 2xx, or a 409 that carries the state as it is.
    pub fn parse<T: serde::de::DeserializeOwned>(&self) -> Result<T, serde_json::Error> {
        serde_json::from_value(self.body.clone())
    }

    /// The [`ApiError`]'s reason, or the bare status.
    pub fn reason(&self) -> String {
        self.body["reason"].as_str().map_or_else(
            || format!("the engine answered {}", self.status),
            str::to_owned,
        )
    }
}

/// Why the operator API gave no answer to act on.
#[derive(Debug, thiserror::Error)]
pub enum OpError {
    /// No answer, or a 5xx: the engine's to fix.
    #[error("cannot reach the engine at {url} ({why})")]
    Unreachable { url: String, why: String },
    /// A 401 or 403 (docs/security.md): the caller's token.
    #[error(
        "the engine refused this caller ({status}): {reason}; set SECKILL_TOKEN (or [auth] token_file) to an operator token"
    )]
    Refused { status: u16, reason: String },
}

/// POSTs `body` to a running engine's operator API with the configured
/// token: the one client the CLI and the TUI share. The daemons are tried
/// in [`crate::observe::engines::operator_urls`]'s order, the next only
/// when one refused the connection (a restarting daemon): the request never
/// reached it, so nothing can have happened twice. Any other failure is the
/// answer. It waits the configured admin timeout; [`post_op_within`] for a
/// call that waits on purpose (a replay's verify, a restore's drain).
pub async fn post_op<B: Serialize>(
    cfg: &crate::config::Config,
    path: &str,
    body: &B,
) -> Result<OpReply, OpError> {
    post_op_within(cfg, path, body, cfg.admin_timeout()).await
}

/// [`post_op`], waiting up to `timeout` for the answer.
pub async fn post_op_within<B: Serialize>(
    cfg: &crate::config::Config,
    path: &str,
    body: &B,
    timeout: std::time::Duration,
) -> Result<OpReply, OpError> {
    let urls = crate::observe::engines::operator_urls(cfg).await;
    let http = cfg.engine_http();
    let mut refused = Vec::new();
    let mut answer = None;
    for url in &urls {
        match http
            .post(format!("{url}{path}"))
            .timeout(timeout)
            .json(body)
            .send()
            .await
        {
            Ok(resp) => {
                answer = Some((url.clone(), resp));
                break;
            }
            // Never reached the daemon: safe to ask the next.
            Err(e) if e.is_connect() => refused.push(format!("{url}: {e}")),
            Err(e) => {
                return Err(OpError::Unreachable {
                    url: url.clone(),
                    why: e.to_string(),
                });
            }
        }
    }
    let Some((url, resp)) = answer else {
        return Err(OpError::Unreachable {
            url: urls.join(", "),
            why: refused.join("; "),
        });
    };
    let unreachable = |why: String| OpError::Unreachable {
        url: url.clone(),
        why,
    };
    let status = resp.status().as_u16();
    let reply = OpReply {
        status,
        body: resp.json().await.unwrap_or_default(),
    };
    match status {
        401 | 403 => Err(OpError::Refused {
            status,
            reason: reply.reason(),
        }),
        500.. => Err(unreachable(format!("{status}: {}", reply.reason()))),
        _ => Ok(reply),
    }
}
