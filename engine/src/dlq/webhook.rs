//! Tells an external tracker of every DLQ ticket transition (docs/architecture.md
//! §9.2): opened, acknowledged, fixed, replaying, verified, reopened,
//! closed. A trigger on `dlq_tickets` writes one `dlq_ticket_events` row per
//! move, whichever code path made it; each row is one JSON POST to a
//! configured URL, retried, with `<ticket_id>/<event_id>` as the
//! `Idempotency-Key`, so a tracker that saw the first attempt can drop a
//! repeat. A ticket's events go out in order: one that fails holds back the
//! ticket's later ones until it is delivered. The last result is kept on the
//! event and in `dlq_tickets.webhook_status`.

use crate::domain::ids::TicketId;
use crate::domain::status::{FailureClass, TicketStatus};
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use std::collections::HashSet;
use std::time::Duration;

/// Attempts per event per pass.
const ATTEMPTS: u32 = 3;

/// One transition as the tracker receives it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct TicketEvent {
    pub event_id: i64,
    pub ticket_id: TicketId,
    pub consumer_group: String,
    pub error_class: FailureClass,
    /// `None` when the ticket was opened.
    pub from_status: Option<TicketStatus>,
    pub status: TicketStatus,
    pub owner: Option<String>,
    pub messages: i64,
    pub dead: i64,
    pub opened_at: DateTime<Utc>,
    pub at: DateTime<Utc>,
}

/// Posts every event not yet delivered: new ones, and failed ones whose
/// last attempt is a minute old. Returns how many were delivered.
pub async fn deliver_pending(
    pool: &PgPool,
    http: &reqwest::Client,
    url: &str,
) -> Result<usize, sqlx::Error> {
    let due: Vec<TicketEvent> = sqlx::query_as(
        "SELECT e.event_id, e.ticket_id, t.consumer_group, t.error_class, e.from_status,
                e.to_status AS status, coalesce(e.owner, t.owner) AS owner,
                (SELECT count(*) FROM dlq_messages m WHERE m.ticket_id = t.ticket_id) AS messages,
                (SELECT count(*) FROM dlq_messages m WHERE m.ticket_id = t.ticket_id AND m.status = 'DEAD') AS dead,
                t.opened_at, e.at
         FROM dlq_ticket_events e JOIN dlq_tickets t ON t.ticket_id = e.ticket_id
         WHERE e.webhook_status IS NULL
            OR e.webhook_status LIKE 'FAILED%' AND e.attempted_at < now() - interval '1 minute'
         ORDER BY e.event_id
         LIMIT 50",
    )
    .fetch_all(pool)
    .await?;
    let mut delivered = 0;
    let mut held_back: HashSet<TicketId> = HashSet::new();
    for e in &due {
        if held_back.contains(&e.ticket_id) {
            continue;
        }
        let status = match post(http, url, e).await {
            Ok(code) => {
                delivered += 1;
                format!("DELIVERED {code}")
            }
            Err(err) => {
                tracing::warn!(ticket_id = %e.ticket_id, event_id = e.event_id, url, error = %err, "ticket webhook failed; retrying in a minute");
                held_back.insert(e.ticket_id.clone());
                format!("FAILED: {err}")
            }
        };
        sqlx::query(
            "UPDATE dlq_ticket_events SET webhook_status = $2, attempted_at = now() WHERE event_id = $1",
        )
        .bind(e.event_id)
        .bind(&status)
        .execute(pool)
        .await?;
        sqlx::query("UPDATE dlq_tickets SET webhook_status = $2 WHERE ticket_id = $1")
            .bind(&e.ticket_id)
            .bind(&status)
            .execute(pool)
            .await?;
    }
    Ok(delivered)
}

/// Why a ticket did not reach the tracker. The text is what
/// `dlq_tickets.webhook_status` keeps after `FAILED: `, so it names the
/// attempt that gave up.
#[derive(Debug, thiserror::Error)]
pub enum WebhookError {
    /// A 4xx other than 408/429: the tracker refused this body, and
    /// sending it again cannot help; check `[dlq] webhook_url` and what the
    /// tracker expects.
    #[error("HTTP {code} (attempt {attempt})")]
    Refused { code: u16, attempt: u32 },
    /// A 5xx, 408 or 429 on the last attempt: retried on a later pass.
    #[error("HTTP {code} (attempt {attempt})")]
    Status { code: u16, attempt: u32 },
    /// No answer (connect, TLS, timeout) on the last attempt.
    #[error("{source} (attempt {attempt})")]
    Transport {
        source: reqwest::Error,
        attempt: u32,
    },
}

/// One event, up to [`ATTEMPTS`] tries with a doubling pause. A 4xx other
/// than 408/429 is final: retrying the same body cannot help.
async fn post(http: &reqwest::Client, url: &str, t: &TicketEvent) -> Result<u16, WebhookError> {
    let key = format!("{}/{}", t.ticket_id, t.event_id);
    let mut pause = Duration::from_millis(200);
    let mut attempt = 1;
    loop {
        let failed = match http
            .post(url)
            .header("Idempotency-Key", key.as_str())
            .json(t)
            .timeout(Duration::from_secs(5))
            .send()
            .await
        {
            Ok(r) if r.status().is_success() => return Ok(r.status().as_u16()),
            Ok(r) => {
                let code = r.status().as_u16();
                if r.status().is_client_error() && code != 408 && code != 429 {
                    return Err(WebhookError::Refused { code, attempt });
                }
                WebhookError::Status { code, attempt }
            }
            Err(source) => WebhookError::Transport { source, attempt },
        };
        if attempt == ATTEMPTS {
            return Err(failed);
        }
        tokio::time::sleep(pause).await;
        pause *= 2;
        attempt += 1;
    }
}
