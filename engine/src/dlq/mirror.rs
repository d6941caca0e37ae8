//! The governor's mirror pass (docs/architecture.md §9.1).
//!
//! Per DLQ queue of each broker (each broker has its own queue 0) the
//! mirror keeps `next_offset` in `dlq_mirror_offsets`, written in the same
//! transaction as the rows it mirrored, so a crash neither skips a dead
//! message nor mirrors it twice; reading a copy again changes nothing, and
//! a new copy of the same message (it died again after a replay) updates
//! its row.

use super::key::DlqEntryKey;
use crate::domain::clock::at_ms;
use crate::domain::ids::{IdError, MessageId, TicketId};
use crate::domain::status::FailureClass;
use crate::mq::rocket::{MqError, RocketAdmin};
use crate::mq::{IncomingMessage, Names, TopicKind, topics};
use sqlx::{PgPool, Postgres, Transaction};

/// Messages read per pull.
const PAGE: i32 = 32;

#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MirrorReport {
    /// Dead messages copied (or refreshed) this pass.
    pub mirrored: usize,
    /// Tickets opened this pass: (ticket id, group, error class).
    pub opened: Vec<(TicketId, String, FailureClass)>,
}

#[derive(Debug, thiserror::Error)]
pub enum MirrorError {
    #[error(transparent)]
    Db(#[from] sqlx::Error),
    #[error(transparent)]
    Mq(#[from] MqError),
}

/// The key of a dead message (pure): its business `message_id`; a message
/// without one (not ours) is keyed by its broker id, and a malformed one is
/// kept as it came, so either is still mirrored and seen (docs/architecture.md
/// §9.1). The parse failure comes back with the key, for the log.
pub fn entry_key(m: &IncomingMessage) -> (DlqEntryKey, Option<IdError>) {
    match m.message_id() {
        None => (DlqEntryKey::broker(&m.broker_msg_id), None),
        Some(raw) => match MessageId::parse(raw) {
            Ok(id) => (DlqEntryKey::Message(id), None),
            Err(e) => (DlqEntryKey::Foreign(raw.to_owned()), Some(e)),
        },
    }
}

/// The topic the message was consumed from: the broker records it in
/// `RETRY_TOPIC` when it moves a retried message; a message dead-lettered
/// on first delivery keeps its own topic.
pub fn original_topic(m: &IncomingMessage, group: &str) -> String {
    match m.property("RETRY_TOPIC") {
        Some(t) if !t.is_empty() => t.to_owned(),
        _ if m.topic.starts_with("%DLQ%") || m.topic.starts_with("%RETRY%") => {
            format!("(unknown: dead in {})", topics::dlq_topic(group))
        }
        _ => m.topic.clone(),
    }
}

/// One pass over every seckill group's DLQ.
pub async fn mirror_once(
    admin: &RocketAdmin,
    pool: &PgPool,
    names: &Names,
) -> Result<MirrorReport, MirrorError> {
    let mut report = MirrorReport::default();
    for kind in TopicKind::ALL {
        let group = names.group(kind);
        let dlq = topics::dlq_topic(&group);
        // The broker creates a DLQ topic with the first dead message; until
        // then there is nothing to read.
        let queues = match admin.queue_offsets(&dlq).await {
            Ok(q) => q,
            Err(e) if e.is_missing_topic() => continue,
            Err(e) => return Err(e.into()),
        };
        // With one broker, an offset saved before brokers were named
        // ('') is that broker's; with several it could be any of theirs,
        // so each starts from its own row or its queue's minimum (reading
        // again is harmless: a copy already mirrored is recognised).
        let one_broker = queues.windows(2).all(|w| w[0].0 == w[1].0);
        for (broker, q) in queues {
            let saved: Option<i64> = sqlx::query_scalar(
                "SELECT next_offset FROM dlq_mirror_offsets
                 WHERE consumer_group = $1 AND queue_id = $3
                   AND (broker_name = $2 OR ($4 AND broker_name = ''))
                 ORDER BY broker_name = $2 DESC LIMIT 1",
            )
            .bind(&group)
            .bind(&broker)
            .bind(q.queue_id)
            .bind(one_broker)
            .fetch_optional(pool)
            .await?;
            let mut offset = saved.unwrap_or(q.min).max(q.min);
            while offset < q.max {
                let pulled = admin.pull(&broker, &dlq, q.queue_id, offset, PAGE).await?;
                let next = pulled.next_offset.max(offset);
                let mut tx = pool.begin().await?;
                for m in &pulled.messages {
                    if let Some(opened) = mirror_one(&mut tx, &group, &broker, m).await? {
                        report.opened.push(opened);
                    }
                    report.mirrored += 1;
                }
                sqlx::query(
                    "INSERT INTO dlq_mirror_offsets (consumer_group, broker_name, queue_id, next_offset)
                     VALUES ($1, $2, $3, $4)
                     ON CONFLICT (consumer_group, broker_name, queue_id)
                     DO UPDATE SET next_offset = EXCLUDED.next_offset, updated_at = now()",
                )
                .bind(&group)
                .bind(&broker)
                .bind(q.queue_id)
                .bind(next)
                .execute(&mut *tx)
                .await?;
                tx.commit().await?;
                if next == offset {
                    break; // nothing readable yet at this offset; next pass
                }
                offset = next;
            }
        }
    }
    for (ticket, group, class) in &report.opened {
        tracing::error!(
            ticket_id = %ticket, group = %group, error_class = %class,
            "DLQ > 0: new ticket opened; see `seckillctl dlq ticket show --ticket {ticket}`"
        );
    }
    Ok(report)
}

/// Mirrors one dead message; returns the ticket it opened, if any. The
/// copy already mirrored (the same broker, queue and offset: the mirror
/// read it again) changes nothing; a new copy (it died again after a
/// replay) makes the entry DEAD again.
async fn mirror_one(
    tx: &mut Transaction<'static, Postgres>,
    group: &str,
    broker: &str,
    m: &IncomingMessage,
) -> Result<Option<(TicketId, String, FailureClass)>, sqlx::Error> {
    let (key, malformed) = entry_key(m);
    if let Some(e) = malformed {
        tracing::warn!(
            group, key = %key, broker_msg_id = %m.broker_msg_id, error = %e,
            "dead message with a malformed message_id: mirrored under it as it came; it cannot be replayed (docs/architecture.md §9.1)"
        );
    }
    let class: FailureClass = sqlx::query_scalar(
        "SELECT error_class FROM consumer_failures
         WHERE consumer_group = $1 AND message_id = $2
         ORDER BY failed_at DESC LIMIT 1",
    )
    .bind(group)
    .bind(&key)
    .fetch_optional(&mut **tx)
    .await?
    .unwrap_or(FailureClass::Unknown);

    let (ticket, opened) = live_ticket(tx, group, class).await?;
    let props = serde_json::to_value(&m.properties).unwrap_or_default();
    sqlx::query(
        "INSERT INTO dlq_messages (consumer_group, message_id, ticket_id, original_topic, broker_msg_id,
                                   dlq_queue_id, dlq_queue_offset, body, properties, error_class,
                                   delivery_attempts, dead_at, dlq_broker)
         VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13)
         ON CONFLICT (consumer_group, message_id) DO UPDATE
         SET ticket_id = EXCLUDED.ticket_id, broker_msg_id = EXCLUDED.broker_msg_id,
             dlq_queue_id = EXCLUDED.dlq_queue_id, dlq_queue_offset = EXCLUDED.dlq_queue_offset,
             dlq_broker = EXCLUDED.dlq_broker,
             error_class = EXCLUDED.error_class, delivery_attempts = EXCLUDED.delivery_attempts,
             dead_at = EXCLUDED.dead_at, mirrored_at = now(),
             -- Died again (docs/architecture.md §9.2, dlq::entry): DEAD, with
             -- replay_count and the failure history kept; a discarded one stays so.
             status = CASE WHEN dlq_messages.status = 'DISCARDED' THEN dlq_messages.status ELSE 'DEAD' END
         -- The same copy read again (a row from before brokers were named
         -- says ''): nothing changes, whatever became of the entry since.
         WHERE NOT (dlq_messages.dlq_queue_id = EXCLUDED.dlq_queue_id
                    AND dlq_messages.dlq_queue_offset = EXCLUDED.dlq_queue_offset
                    AND dlq_messages.dlq_broker IN (EXCLUDED.dlq_broker, ''))",
    )
    .bind(group)
    .bind(&key)
    .bind(&ticket)
    .bind(original_topic(m, group))
    .bind(&m.broker_msg_id)
    .bind(m.queue_id)
    .bind(m.queue_offset)
    .bind(&m.body)
    .bind(props)
    .bind(class)
    // The broker bumps the reconsume count once more as it dead-letters,
    // so the DLQ copy's count is the number of deliveries made.
    .bind(m.reconsume_times.max(1))
    .bind(at_ms(m.store_timestamp_ms))
    .bind(broker)
    .execute(&mut **tx)
    .await?;
    Ok(opened.then(|| (ticket, group.to_owned(), class)))
}

/// The one live ticket of (group, error class), opened if there is none
/// (docs/architecture.md §9.2: a partial unique index allows one that is
/// not CLOSED). True when this call opened it.
async fn live_ticket(
    tx: &mut Transaction<'static, Postgres>,
    group: &str,
    class: FailureClass,
) -> Result<(TicketId, bool), sqlx::Error> {
    let opened: Option<TicketId> = sqlx::query_scalar(
        "INSERT INTO dlq_tickets (ticket_id, consumer_group, error_class)
         VALUES ($1, $2, $3)
         ON CONFLICT (consumer_group, error_class) WHERE status <> 'CLOSED' DO NOTHING
         RETURNING ticket_id",
    )
    .bind(TicketId::generate())
    .bind(group)
    .bind(class)
    .fetch_optional(&mut **tx)
    .await?;
    if let Some(t) = opened {
        return Ok((t, true));
    }
    let live = sqlx::query_scalar(
        "SELECT ticket_id FROM dlq_tickets
         WHERE consumer_group = $1 AND error_class = $2 AND status <> 'CLOSED'",
    )
    .bind(group)
    .bind(class)
    .fetch_one(&mut **tx)
    .await?;
    Ok((live, false))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::BTreeMap;

    fn msg(props: &[(&str, &str)], topic: &str) -> IncomingMessage {
        IncomingMessage {
            topic: topic.into(),
            tag: None,
            keys: vec![],
            properties: props
                .iter()
                .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                .collect::<BTreeMap<_, _>>(),
            body: vec![],
            broker_msg_id: "B1".into(),
            queue_id: 0,
            queue_offset: 0,
            reconsume_times: 3,
            store_timestamp_ms: 0,
            born_timestamp_ms: 0,
        }
    }

    #[test]
    fn the_original_topic_and_key_come_from_the_properties() {
        let id = MessageId::generate();
        let m = msg(
            &[("RETRY_TOPIC", "T"), ("message_id", id.as_str())],
            "%DLQ%G",
        );
        assert_eq!(original_topic(&m, "G"), "T");
        assert_eq!(entry_key(&m), (DlqEntryKey::Message(id), None));
        let foreign = msg(&[], "%DLQ%G");
        assert_eq!(entry_key(&foreign), (DlqEntryKey::broker("B1"), None));
        assert!(original_topic(&foreign, "G").starts_with("(unknown"));
    }

    #[test]
    fn a_malformed_message_id_is_kept_as_it_came_and_its_parse_failure_reported() {
        let m = msg(&[("message_id", "evt_1")], "%DLQ%G");
        let (key, malformed) = entry_key(&m);
        assert_eq!(key, DlqEntryKey::Foreign("evt_1".into()));
        assert_eq!(key.as_str(), "evt_1", "stored exactly as before");
        assert!(malformed.is_some_and(|e| e.value == "evt_1"));
    }
}
