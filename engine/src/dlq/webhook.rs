//! Opens each new DLQ ticket in an external tracker (docs/architecture.md §9.2): one
//! JSON POST per ticket to a configured URL, retried, with the `ticket_id`
//! as the `Idempotency-Key`, so a tracker that saw the first attempt can
//! drop a repeat. The result is kept in `dlq_tickets.webhook_status`.

use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use std::time::Duration;

/// Attempts per ticket per pass.
const ATTEMPTS: u32 = 3;

#[derive(Debug, Clone, PartialEq, Eq, Serialize, sqlx::FromRow)]
pub struct TicketOpened {
    pub ticket_id: String,
    pub consumer_group: String,
    pub error_class: String,
    pub status: String,
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
        "SELECT t.ticket_id, t.consumer_group, t.error_class::text, t.status::text,
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

/// One ticket, up to [`ATTEMPTS`] tries with a doubling pause. A 4xx other
/// than 408/429 is final: retrying the same body cannot help.
async fn post(http: &reqwest::Client, url: &str, t: &TicketOpened) -> Result<u16, String> {
    let mut pause = Duration::from_millis(200);
    let mut last = String::new();
    for attempt in 1..=ATTEMPTS {
        match http
            .post(url)
            .header("Idempotency-Key", &t.ticket_id)
            .json(t)
            .timeout(Duration::from_secs(5))
            .send()
            .await
        {
            Ok(r) if r.status().is_success() => return Ok(r.status().as_u16()),
            Ok(r) => {
                let code = r.status().as_u16();
                last = format!("HTTP {code} (attempt {attempt})");
                if r.status().is_client_error() && code != 408 && code != 429 {
                    return Err(last);
                }
            }
            Err(e) => last = format!("{e} (attempt {attempt})"),
        }
        if attempt < ATTEMPTS {
            tokio::time::sleep(pause).await;
            pause *= 2;
        }
    }
    Err(last)
}
