//! `seckillctl trace` (docs/architecture.md §11.6): one reservation's story
//! from every store, as one timeline, with a verdict.
//!
//! An anchor (a message, reservation, order or request id) is resolved to
//! its reservation. PostgreSQL's facts are read in one REPEATABLE READ
//! snapshot, Redis after it: the writers release Redis first and settle
//! PostgreSQL second, so reading the other way round could pair a settled
//! compensation with a hash read before its release, and call a healthy
//! story broken.

use crate::decide::story::{self, Facts, RedisHold, StoryVerdict};
use crate::domain::ids::{ActivityId, MessageId, OrderId, RequestId, ReservationId};
use crate::domain::status::{CompensationStatus, DlqEntryStatus, OrderStatus, ReservationOutcome};
use crate::domain::trace::TraceId;
use crate::mq::rocket::RocketAdmin;
use crate::mq::topics::{dlq_topic, retry_topic};
use crate::mq::{Names, TopicKind};
use crate::reservation::{MqStatus, ReservationError, ReservationStore};
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;

/// What `trace` is asked about.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Anchor {
    Message(MessageId),
    Reservation(ReservationId),
    Order(OrderId),
    Request(RequestId),
}

impl std::str::FromStr for Anchor {
    type Err = TraceError;

    /// By its prefix: `evt_`, `rsv_`, `ord_` or `req_`.
    fn from_str(s: &str) -> Result<Self, TraceError> {
        let bad = || TraceError::BadAnchor(s.to_owned());
        let s = s.trim();
        Ok(match s.split('_').next() {
            Some("evt") => Anchor::Message(MessageId::parse(s).map_err(|_| bad())?),
            Some("rsv") => Anchor::Reservation(ReservationId::parse(s).map_err(|_| bad())?),
            Some("ord") => Anchor::Order(OrderId::parse(s).map_err(|_| bad())?),
            Some("req") => Anchor::Request(RequestId::parse(s).map_err(|_| bad())?),
            _ => return Err(bad()),
        })
    }
}

#[derive(Debug, thiserror::Error)]
pub enum TraceError {
    #[error(
        "{0:?} is not a message (evt_…), reservation (rsv_…), order (ord_…) or request (req_…) id"
    )]
    BadAnchor(String),
    #[error("no reservation is known by {0}: neither PostgreSQL nor Redis holds it")]
    Unknown(String),
    #[error("PostgreSQL: {0}")]
    Db(#[from] sqlx::Error),
    #[error("Redis: {0}")]
    Redis(#[from] ReservationError),
}

/// One line of the timeline.
#[derive(Debug, Clone, Serialize)]
pub struct Line {
    pub at: Option<DateTime<Utc>>,
    /// `postgresql`, `redis` or `broker`.
    pub source: &'static str,
    pub event: String,
    pub detail: String,
}

/// One reservation's story.
#[derive(Debug, Clone, Serialize)]
pub struct Story {
    pub anchor: String,
    pub reservation_id: ReservationId,
    pub activity_id: ActivityId,
    pub trace_id: TraceId,
    pub lines: Vec<Line>,
    pub verdict: StoryVerdict,
    pub reason: String,
}

#[derive(sqlx::FromRow)]
struct ReservationRow {
    message_id: String,
    order_id: String,
    activity_id: ActivityId,
    sku_id: i64,
    user_id: i64,
    outcome: ReservationOutcome,
    reserved_at: DateTime<Utc>,
    decided_at: DateTime<Utc>,
    trace_id: Option<String>,
}

#[derive(sqlx::FromRow)]
struct OrderRow {
    order_id: String,
    status: OrderStatus,
    created_at: DateTime<Utc>,
    expires_at: DateTime<Utc>,
    paid_at: Option<DateTime<Utc>>,
    canceled_at: Option<DateTime<Utc>>,
    cancel_reason: Option<String>,
}

#[derive(sqlx::FromRow)]
struct OutboxRow {
    message_id: String,
    tag: String,
    status: String,
    created_at: DateTime<Utc>,
    sent_at: Option<DateTime<Utc>>,
}

#[derive(sqlx::FromRow)]
struct CompensationRow {
    status: CompensationStatus,
    source: String,
    reason: String,
    created_at: DateTime<Utc>,
    released_at: Option<DateTime<Utc>>,
}

#[derive(sqlx::FromRow)]
struct InboxRow {
    consumer_group: String,
    message_id: String,
    status: String,
    result_code: Option<String>,
    delivery_attempt: i32,
    created_at: DateTime<Utc>,
}

#[derive(sqlx::FromRow)]
struct DeadRow {
    consumer_group: String,
    message_id: String,
    status: DlqEntryStatus,
    replay_count: i32,
    dlq_queue_id: i32,
    dlq_queue_offset: i64,
    dead_at: DateTime<Utc>,
}

#[derive(sqlx::FromRow)]
struct ReplayRow {
    replay_id: String,
    operator: String,
    decision: String,
    outcome: String,
    created_at: DateTime<Utc>,
}

/// Finds the reservation an anchor names, and its activity: PostgreSQL
/// first, then Redis for a reservation not yet consumed.
async fn resolve(
    pool: &PgPool,
    store: &ReservationStore,
    anchor: &Anchor,
) -> Result<Option<(ReservationId, ActivityId)>, TraceError> {
    // The message, request and dead-message lookups scan their tables: an
    // index on each would cost every order a write, for a rare read.
    let (sql, key) = match anchor {
        Anchor::Reservation(id) => (
            "SELECT reservation_id, activity_id FROM reservations WHERE reservation_id = $1",
            id.to_string(),
        ),
        Anchor::Order(id) => (
            "SELECT reservation_id, activity_id FROM orders WHERE order_id = $1
             UNION ALL SELECT reservation_id, activity_id FROM reservations WHERE order_id = $1
             LIMIT 1",
            id.to_string(),
        ),
        Anchor::Message(id) => (
            "SELECT reservation_id, activity_id FROM reservations WHERE message_id = $1",
            id.to_string(),
        ),
        Anchor::Request(id) => (
            "SELECT reservation_id, activity_id FROM reservations WHERE request_id = $1",
            id.to_string(),
        ),
    };
    let row: Option<(String, ActivityId)> =
        sqlx::query_as(sql).bind(&key).fetch_optional(pool).await?;
    if let Some((rsv, activity)) = row
        && let Ok(rsv) = ReservationId::parse(&rsv)
    {
        return Ok(Some((rsv, activity)));
    }
    // A message that died before any transaction decided it: its body,
    // parsed here, names the reservation (a body that is not an order
    // message names none).
    if let Anchor::Message(id) = anchor {
        let bodies: Vec<Vec<u8>> =
            sqlx::query_scalar("SELECT body FROM dlq_messages WHERE message_id = $1")
                .bind(id.to_string())
                .fetch_all(pool)
                .await?;
        if let Some(m) = bodies
            .iter()
            .find_map(|b| crate::domain::message::parse_order_create(b).ok())
        {
            return Ok(Some((m.reservation_id, m.activity_id)));
        }
    }
    // Not consumed yet: only Redis knows it, under its activity.
    if let Anchor::Reservation(id) = anchor {
        for activity in store.activities().await? {
            if store.get(activity, id).await?.is_some() {
                return Ok(Some((id.clone(), activity)));
            }
        }
    }
    Ok(None)
}

/// Where the story is read from. Without a broker admin, the broker's own
/// copies are not looked up (its sends and deaths still show, as PostgreSQL
/// recorded them).
pub struct Sources<'a> {
    pub pool: &'a PgPool,
    pub store: &'a ReservationStore,
    pub broker: Option<(&'a RocketAdmin, &'a Names)>,
}

/// The broker's copies of the reservation's order message, by its key:
/// stored, retrying, or dead (docs/architecture.md §11.6). A lookup that
/// fails is a line of the story, not its end.
async fn broker_lines(admin: &RocketAdmin, names: &Names, rsv: &ReservationId) -> Vec<Line> {
    let group = names.group(TopicKind::OrderCreate);
    let since = rsv.created_at_ms().unwrap_or(0) - 60_000;
    let mut lines = Vec::new();
    for (topic, event) in [
        (names.topic(TopicKind::OrderCreate), "stored"),
        (retry_topic(&group), "retrying"),
        (dlq_topic(&group), "in the DLQ"),
    ] {
        match admin.by_key(&topic, rsv.as_str(), since, 32).await {
            Ok(found) => lines.extend(found.into_iter().map(|m| Line {
                at: DateTime::from_timestamp_millis(m.store_timestamp_ms),
                source: "broker",
                event: event.to_owned(),
                detail: format!(
                    "{} queue {} offset {}, delivery {}, {}",
                    m.topic,
                    m.queue_id,
                    m.queue_offset,
                    m.reconsume_times,
                    m.message_id().unwrap_or("-")
                ),
            })),
            Err(e) => lines.push(Line {
                at: None,
                source: "broker",
                event: "lookup failed".to_owned(),
                detail: format!("{topic}: {e}"),
            }),
        }
    }
    lines
}

/// The story of the reservation `anchor` names.
pub async fn trace(
    sources: &Sources<'_>,
    anchor: &Anchor,
    anchor_text: &str,
) -> Result<Story, TraceError> {
    let (pool, store) = (sources.pool, sources.store);
    let (rsv, activity) = resolve(pool, store, anchor)
        .await?
        .ok_or_else(|| TraceError::Unknown(anchor_text.to_owned()))?;
    let id = rsv.to_string();
    // The message ids this story may touch, known before the snapshot:
    // the anchor's, and the one Redis holds (ids never change).
    let mut message_ids: Vec<String> = Vec::new();
    if let Anchor::Message(m) = anchor {
        message_ids.push(m.to_string());
    }
    if let Some(h) = store.get(activity, &rsv).await? {
        message_ids.push(h.message_id.to_string());
    }
    let mut lines = Vec::new();
    let mut facts = Facts::default();
    let mut trace_id = None;
    let pg = |at, event: &str, detail: String| Line {
        at,
        source: "postgresql",
        event: event.to_owned(),
        detail,
    };

    // PostgreSQL, one snapshot.
    let mut tx = pool.begin().await?;
    sqlx::query("SET TRANSACTION ISOLATION LEVEL REPEATABLE READ READ ONLY")
        .execute(&mut *tx)
        .await?;
    let row: Option<ReservationRow> = sqlx::query_as(
        "SELECT message_id, order_id, activity_id, sku_id, user_id, outcome, reserved_at,
                decided_at, trace_id
         FROM reservations WHERE reservation_id = $1",
    )
    .bind(&id)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(r) = &row {
        facts.outcome = Some(r.outcome);
        trace_id = r.trace_id.as_deref().and_then(TraceId::parse);
        if !message_ids.contains(&r.message_id) {
            message_ids.push(r.message_id.clone());
        }
        lines.push(pg(
            Some(r.reserved_at),
            "reserved",
            format!(
                "activity {} sku {} user {}, order {}",
                r.activity_id, r.sku_id, r.user_id, r.order_id
            ),
        ));
        lines.push(pg(
            Some(r.decided_at),
            "decided",
            format!("{} by message {}", r.outcome.as_str(), r.message_id),
        ));
    }
    let order: Option<OrderRow> = sqlx::query_as(
        "SELECT order_id, status, created_at, expires_at, paid_at, canceled_at, cancel_reason
         FROM orders WHERE reservation_id = $1",
    )
    .bind(&id)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(o) = &order {
        facts.order = Some(o.status);
        lines.push(pg(
            Some(o.created_at),
            "order created",
            format!("{}, pay by {}", o.order_id, o.expires_at.to_rfc3339()),
        ));
        if let Some(at) = o.paid_at {
            lines.push(pg(Some(at), "order paid", o.order_id.clone()));
        }
        if let Some(at) = o.canceled_at {
            lines.push(pg(
                Some(at),
                "order canceled",
                o.cancel_reason.clone().unwrap_or_default(),
            ));
        }
    }
    let ledger: Vec<(String, i64, DateTime<Utc>)> = sqlx::query_as(
        "SELECT reason::text, delta, created_at FROM inventory_ledger
         WHERE reservation_id = $1 ORDER BY ledger_id",
    )
    .bind(&id)
    .fetch_all(&mut *tx)
    .await?;
    for (reason, delta, at) in ledger {
        lines.push(pg(Some(at), "ledger", format!("{reason} {delta:+}")));
    }
    let outbox: Vec<OutboxRow> = sqlx::query_as(
        "SELECT message_id, tag, status::text AS status, created_at, sent_at FROM event_outbox
         WHERE payload->>'reservation_id' = $1 ORDER BY outbox_id",
    )
    .bind(&id)
    .fetch_all(&mut *tx)
    .await?;
    for o in outbox {
        lines.push(pg(
            Some(o.created_at),
            "outbox",
            format!("{} {} {}", o.tag, o.message_id, o.status),
        ));
        if let Some(at) = o.sent_at {
            lines.push(Line {
                at: Some(at),
                source: "broker",
                event: "sent".to_owned(),
                detail: format!("{} {}", o.tag, o.message_id),
            });
        }
        message_ids.push(o.message_id);
    }
    let comp: Option<CompensationRow> = sqlx::query_as(
        "SELECT status, source::text AS source, reason, created_at, released_at
         FROM compensation_tasks WHERE reservation_id = $1",
    )
    .bind(&id)
    .fetch_optional(&mut *tx)
    .await?;
    if let Some(c) = comp {
        facts.compensation = Some(c.status);
        lines.push(pg(
            Some(c.created_at),
            "compensation",
            format!("{}: {} ({})", c.source, c.reason, c.status.as_str()),
        ));
        if let Some(at) = c.released_at {
            lines.push(pg(Some(at), "stock released", c.source));
        }
    }
    let inbox: Vec<InboxRow> = sqlx::query_as(
        "SELECT consumer_group, message_id, status::text AS status, result_code,
                delivery_attempt, created_at
         FROM consumer_inbox WHERE message_id = ANY($1) ORDER BY created_at",
    )
    .bind(&message_ids)
    .fetch_all(&mut *tx)
    .await?;
    for r in inbox {
        lines.push(pg(
            Some(r.created_at),
            "consumed",
            format!(
                "{}: {} {} {} (delivery {})",
                r.consumer_group,
                r.message_id,
                r.status,
                r.result_code.unwrap_or_default(),
                r.delivery_attempt
            ),
        ));
    }
    let dead: Vec<DeadRow> = sqlx::query_as(
        "SELECT consumer_group, message_id, status, replay_count, dlq_queue_id,
                dlq_queue_offset, dead_at
         FROM dlq_messages WHERE message_id = ANY($1)
         ORDER BY dead_at",
    )
    .bind(&message_ids)
    .fetch_all(&mut *tx)
    .await?;
    for d in dead {
        facts.dlq = Some(d.status);
        lines.push(Line {
            at: Some(d.dead_at),
            source: "broker",
            event: "dead-lettered".to_owned(),
            detail: format!(
                "{}: {} in %DLQ% queue {} offset {}; {} after {} replays",
                d.consumer_group,
                d.message_id,
                d.dlq_queue_id,
                d.dlq_queue_offset,
                d.status.as_str(),
                d.replay_count
            ),
        });
        if !message_ids.contains(&d.message_id) {
            message_ids.push(d.message_id);
        }
    }
    let replays: Vec<ReplayRow> = sqlx::query_as(
        "SELECT replay_id, operator, decision::text AS decision, outcome::text AS outcome,
                created_at
         FROM replay_audit WHERE message_id = ANY($1) ORDER BY created_at",
    )
    .bind(&message_ids)
    .fetch_all(&mut *tx)
    .await?;
    for r in replays {
        lines.push(pg(
            Some(r.created_at),
            "replay",
            format!(
                "{} by {}: {}, {}",
                r.replay_id, r.operator, r.decision, r.outcome
            ),
        ));
    }
    tx.commit().await?;

    // Redis, after PostgreSQL (see the module's comment).
    match store.get(activity, &rsv).await? {
        Some(h) => {
            facts.redis = Some(match h.mq_status {
                MqStatus::MqPending | MqStatus::Sending | MqStatus::MqSent => RedisHold::Reserved,
                MqStatus::SendFailed => RedisHold::SendFailed,
                MqStatus::Released => RedisHold::Released,
            });
            trace_id = trace_id.or(Some(h.trace_id.clone()));
            lines.push(Line {
                at: DateTime::from_timestamp_millis(h.created_at_ms),
                source: "redis",
                event: "reservation".to_owned(),
                detail: format!(
                    "{} after {} scanner attempts{}{}",
                    h.mq_status.as_str(),
                    h.send_attempt,
                    h.broker_message_id
                        .map(|b| format!(", broker id {b}"))
                        .unwrap_or_default(),
                    h.last_error
                        .map(|e| format!(", last error: {e}"))
                        .unwrap_or_default(),
                ),
            });
        }
        None => lines.push(Line {
            at: None,
            source: "redis",
            event: "reservation".to_owned(),
            detail: "no hash (released, expired, or never written here)".to_owned(),
        }),
    }
    if let Some((admin, names)) = sources.broker {
        lines.extend(broker_lines(admin, names, &rsv).await);
    }
    lines.sort_by_key(|l| (l.at.is_none(), l.at));
    let (verdict, reason) = story::judge(&facts);
    Ok(Story {
        anchor: anchor_text.to_owned(),
        trace_id: trace_id.unwrap_or_else(|| TraceId::of_reservation(&rsv)),
        reservation_id: rsv,
        activity_id: activity,
        lines,
        verdict,
        reason,
    })
}
