//! The pay-and-cancel half of the cancel-early-late drill (row #9 of
//! docs/architecture.md §13.5; the cancel is §8): cancel messages delivered
//! before the deadline and after payment, and how late the real cancels come.

use super::stage::Stage;
use super::verdict::Figures;
use anyhow::{Context, Result};
use rand::seq::SliceRandom;
use seckill_engine::{MessageId, OrderId, PayBody, TopicKind, facts, order};
use std::time::{Duration, Instant};

/// Cancel messages of each kind the drill sends out of turn.
const OUT_OF_TURN: i64 = 100;
/// The deadline promise (issue 15): p99 of cancel time − deadline.
const P99_LATE_LIMIT_S: f64 = 2.0;

/// Sends early cancels, pays half the orders, waits until every unpaid one
/// is canceled and given back, sends late cancels for paid ones, then
/// judges: nothing canceled early, nothing paid canceled, p99 lateness.
pub async fn early_and_late_cancels(stage: &Stage, f: &mut Figures) -> Result<()> {
    let topic = stage.names.topic(TopicKind::OrderTimeout);
    let early = copy_cancels(stage, &topic, "status = 'CREATED'").await?;
    let paid = pay_half(stage).await?;
    let last_deadline: Option<chrono::DateTime<chrono::Utc>> =
        sqlx::query_scalar("SELECT max(expires_at) FROM orders WHERE activity_id = $1")
            .bind(stage.activity)
            .fetch_one(&stage.pool)
            .await?;
    let settled_at = wait_settled(stage, Duration::from_secs(90)).await?;
    f.recovery_s = settled_at
        .and_then(|at| last_deadline.map(|d| (at - d).num_milliseconds().max(0) as f64 / 1000.0));
    let noop_before = paid_noops(stage).await;
    let late = copy_cancels(stage, &topic, "status = 'PAID'").await?;
    wait_paid_noops(
        stage,
        noop_before + late.len() as u64,
        Duration::from_secs(30),
    )
    .await;

    let canceled_early: i64 = sqlx::query_scalar(
        "SELECT count(*) FROM orders WHERE order_id = ANY($1) AND canceled_at < expires_at",
    )
    .bind(&early)
    .fetch_one(&stage.pool)
    .await?;
    let lateness = lateness_s(stage).await?;
    let (timer, sweep) = stage.stats().await.iter().fold((0, 0), |(t, s), v| {
        (t + v.lifecycle.canceled, s + v.lifecycle.sweep_canceled)
    });
    f.notes.push(format!(
        "{} early and {} late cancel messages; {paid} orders paid; {timer} canceled by their timer message, {sweep} by the sweep",
        early.len(),
        late.len()
    ));
    if let Some(t) = timer_path(stage).await? {
        f.notes.push(t);
    }
    if let Some((p50, p99, max)) = lateness {
        f.notes.push(format!(
            "cancel − deadline: p50 {p50:.2} s, p99 {p99:.2} s, max {max:.2} s"
        ));
        if p99 > P99_LATE_LIMIT_S {
            f.unmet.push(format!(
                "cancels came {p99:.2} s after the deadline at p99; the target is {P99_LATE_LIMIT_S} s"
            ));
        }
    }
    if canceled_early > 0 {
        f.unmet.push(format!(
            "{canceled_early} order(s) canceled before their deadline"
        ));
    }
    if sweep > 0 {
        f.unmet.push(format!(
            "the sweep canceled {sweep} order(s): the timer messages must do it, the sweep is the safety net"
        ));
    }
    // The lifecycle moved on since the first reconcile: judge the end state.
    f.violated = stage.violated().await?;
    Ok(())
}

/// Copies up to [`OUT_OF_TURN`] sent ORDER_TIMEOUT rows of orders matching
/// `which` into new outbox rows with fresh message ids, due now: the
/// outbox sends them at once, before (or after) their deadline. The order
/// ids they target.
async fn copy_cancels(stage: &Stage, topic: &str, which: &str) -> Result<Vec<String>> {
    let rows: Vec<(String, String, String, serde_json::Value)> = sqlx::query_as(&format!(
        "SELECT e.topic, e.tag, e.message_key, e.payload FROM event_outbox e
         JOIN orders o ON o.order_id = e.payload->>'order_id'
         WHERE e.topic = $1 AND o.activity_id = $2 AND o.{which}
         ORDER BY e.outbox_id LIMIT $3"
    ))
    .bind(topic)
    .bind(stage.activity)
    .bind(OUT_OF_TURN)
    .fetch_all(&stage.pool)
    .await
    .context("read the cancel messages to copy")?;
    let mut orders = Vec::with_capacity(rows.len());
    for (topic, tag, key, mut payload) in rows {
        let id = MessageId::generate().to_string();
        payload["message_id"] = serde_json::Value::String(id.clone());
        if let Some(o) = payload["order_id"].as_str() {
            orders.push(o.to_owned());
        }
        sqlx::query(
            "INSERT INTO event_outbox (message_id, topic, tag, message_key, payload, deliver_at)
             VALUES ($1, $2, $3, $4, $5, NULL)",
        )
        .bind(&id)
        .bind(topic)
        .bind(tag)
        .bind(key)
        .bind(payload)
        .execute(&stage.pool)
        .await?;
    }
    Ok(orders)
}

/// Pays half of the unpaid orders through the engine; how many were paid.
async fn pay_half(stage: &Stage) -> Result<usize> {
    let mut ids: Vec<OrderId> = order::unpaid_ids(&stage.pool, stage.activity).await?;
    ids.shuffle(&mut rand::rng());
    ids.truncate(ids.len() / 2);
    let url = stage
        .engine_urls()
        .into_iter()
        .next()
        .context("no engine to pay through")?;
    let mut paid = 0;
    for id in &ids {
        let ok = stage
            .http
            .post(format!("{url}/v1/orders/{id}/pay"))
            .json(&PayBody::default())
            .send()
            .await
            .is_ok_and(|r| r.status().is_success());
        paid += usize::from(ok);
    }
    Ok(paid)
}

/// Waits until no order is unpaid and no compensation pending; when.
async fn wait_settled(
    stage: &Stage,
    limit: Duration,
) -> Result<Option<chrono::DateTime<chrono::Utc>>> {
    let started = Instant::now();
    loop {
        let l = facts::lifecycle(&stage.pool, stage.activity).await?;
        if l.settled() {
            return Ok(Some(chrono::Utc::now()));
        }
        if started.elapsed() > limit {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn paid_noops(stage: &Stage) -> u64 {
    stage
        .stats()
        .await
        .iter()
        .map(|s| s.lifecycle.cancel_noop_already_paid)
        .sum()
}

async fn wait_paid_noops(stage: &Stage, n: u64, limit: Duration) {
    let started = Instant::now();
    while paid_noops(stage).await < n && started.elapsed() < limit {
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// Where a cancel's lateness comes from (issue 15): the broker's timer
/// (stored in the topic − `deliver_at`, read back from the ORDER_TIMEOUT
/// queues) and the cancel consumer (`canceled_at` − stored), p50 and p99.
async fn timer_path(stage: &Stage) -> Result<Option<String>> {
    let topic = stage.names.topic(TopicKind::OrderTimeout);
    let mut stored_at: std::collections::HashMap<String, i64> = Default::default();
    let mut broker = Vec::new();
    for (name, q) in stage.admin.queue_offsets(&topic).await? {
        let mut offset = q.min;
        while offset < q.max {
            let pulled = stage
                .admin
                .pull(&name, &topic, q.queue_id, offset, 32)
                .await?;
            if pulled.messages.is_empty() {
                break;
            }
            for m in &pulled.messages {
                let Ok(body) = serde_json::from_slice::<serde_json::Value>(&m.body) else {
                    continue;
                };
                let (Some(order), Some(due)) = (
                    body["order_id"].as_str(),
                    body["deliver_at"]
                        .as_str()
                        .and_then(|d| chrono::DateTime::parse_from_rfc3339(d).ok()),
                ) else {
                    continue;
                };
                let due_ms = due.timestamp_millis();
                // Timer messages only: sent well before they were due.
                if m.born_timestamp_ms < due_ms - 500 {
                    broker.push((m.store_timestamp_ms - due_ms) as f64 / 1000.0);
                    let at = stored_at.entry(order.to_owned()).or_default();
                    *at = (*at).max(m.store_timestamp_ms);
                }
            }
            offset = pulled.next_offset;
        }
    }
    let canceled: Vec<(String, chrono::DateTime<chrono::Utc>)> = sqlx::query_as(
        "SELECT order_id, canceled_at FROM orders
         WHERE activity_id = $1 AND cancel_reason = 'PAY_TIMEOUT'",
    )
    .bind(stage.activity)
    .fetch_all(&stage.pool)
    .await?;
    let mut consumer: Vec<f64> = canceled
        .iter()
        .filter_map(|(o, at)| {
            stored_at
                .get(o)
                .map(|s| (at.timestamp_millis() - s) as f64 / 1000.0)
        })
        .collect();
    if broker.is_empty() {
        return Ok(None);
    }
    let (b50, b99) = p50_p99(&mut broker);
    let (c50, c99) = p50_p99(&mut consumer);
    Ok(Some(format!(
        "broker timer (stored − deliver_at): p50 {b50:.2} s, p99 {b99:.2} s over {} messages; cancel consumer (canceled − stored): p50 {c50:.2} s, p99 {c99:.2} s",
        broker.len()
    )))
}

fn p50_p99(v: &mut [f64]) -> (f64, f64) {
    if v.is_empty() {
        return (f64::NAN, f64::NAN);
    }
    v.sort_by(f64::total_cmp);
    let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
    (at(0.5), at(0.99))
}

/// (p50, p99, max) of cancel time − deadline over the pay-timeout cancels.
async fn lateness_s(stage: &Stage) -> Result<Option<(f64, f64, f64)>> {
    let row: Option<(Option<f64>, Option<f64>, Option<f64>)> = sqlx::query_as(
        "SELECT percentile_cont(0.5) WITHIN GROUP (ORDER BY s),
                percentile_cont(0.99) WITHIN GROUP (ORDER BY s),
                max(s)
         FROM (SELECT extract(epoch FROM canceled_at - expires_at)::float8 AS s
               FROM orders WHERE activity_id = $1 AND cancel_reason = 'PAY_TIMEOUT') t",
    )
    .bind(stage.activity)
    .fetch_optional(&stage.pool)
    .await?;
    Ok(match row {
        Some((Some(a), Some(b), Some(c))) => Some((a, b, c)),
        _ => None,
    })
}
