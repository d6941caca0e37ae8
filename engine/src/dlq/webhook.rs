//! Opens each new DLQ ticket in an external tracker (docs/architecture.md §9.2): one
//! JSON POST per ticket to a configured URL, retried, with the `ticket_id`
//! as the `Idempotency-Key`, so a tracker that saw the first attempt can
//! drop a repeat. The result is kept in `dlq_tickets.webhook_status`.

use crate::domain::ids::TicketId;
use crate::domain::status::{FailureClass, TicketStatus};
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use std::time::Duration;

/// Attempts per ticket per pass.
const ATTEMPTS: u32 = 3;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct TicketOpened {
    pub ticket_id: TicketId,
    pub consumer_group: String,
    pub error_class: FailureClass,
    pub status: TicketStatus,
    pub messages: i64,
    pub opened_at: DateTime<Utc>,
}

/// Posts every ticket not yet delivered: new ones, and failed ones whose
/// last attempt is a minute old. Returns how many were delivered.
pub async fn deliver_pending(
    pool: &PgPool,
    http: &reqwest::Client,
    url: &str,
) -> Result<usize, sqlx::Error> {
    let due: Vec<TicketOpened> = sqlx::query_as(
        "SELECT t.ticket_id, t.consumer_group, t.error_class, t.status,
                (SELECT count(*) FROM dlq_messages m WHERE m.ticket_id = t.ticket_id) AS messages,
                t.opened_at
         FROM dlq_tickets t
         WHERE t.status <> 'CLOSED'
           AND (t.webhook_status IS NULL
                OR t.webhook_status LIKE 'FAILED%' AND t.updated_at < now() - interval '1 minute')
         ORDER BY t.opened_at
         LIMIT 20",
    )
    .fetch_all(pool)
    .await?;
    let mut delivered = 0;
    for t in &due {
        let status = match post(http, url, t).await {
            Ok(code) => {
                delivered += 1;
                format!("DELIVERED {code}")
            }
            Err(e) => {
                tracing::warn!(ticket_id = %t.ticket_id, url, error = %e, "ticket webhook failed; retrying in a minute");
                format!("FAILED: {e}")
            }
        };
        sqlx::query(
            "UPDATE dlq_tickets SET webhook_status = $2, updated_at = now() WHERE ticket_id = $1",
        )
        .bind(&t.ticket_id)
        .bind(status)
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

/// One ticket, up to [`ATTEMPTS`] tries with a doubling pause. A 4xx other
/// than 408/429 is final: retrying the same body cannot help.
async fn post(http: &reqwest::Client, url: &str, t: &TicketOpened) -> Result<u16, WebhookError> {
    let mut pause = Duration::from_millis(200);
    let mut attempt = 1;
    loop {
        let failed = match http
            .post(url)
            .header("Idempotency-Key", t.ticket_id.as_str())
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
