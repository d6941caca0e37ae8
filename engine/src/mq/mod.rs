//! The message-queue boundary (docs/architecture.md §6.2, §7): small traits the pipeline
//! codes against, plain message types, and the rocketmq-rust implementation
//! behind them in [`rocket`].
//!
//! Inputs: outgoing messages with the business `message_id` as a user
//! property and `reservation_id` as the key. Outputs: a [`SendOutcome`] per
//! send, [`IncomingMessage`]s handed to a [`Handler`], and admin facts (lag,
//! routes, versions).

pub mod classify;
pub mod position;
pub mod rocket;
pub mod topics;

pub use classify::{DefiniteCause, UnknownCause};
pub use topics::{Names, Sender, TopicKind, TopicType};

use serde::Serialize;
use std::collections::BTreeMap;
use std::future::Future;
use std::time::Duration;

/// The user property that carries the business message id (docs/architecture.md §3).
pub const PROP_MESSAGE_ID: &str = "message_id";
/// Set on operator replays (docs/architecture.md §9.4).
pub const PROP_REPLAY_ID: &str = "replay_id";
pub const PROP_REPLAY_COUNT: &str = "replay_count";
/// W3C trace context carried in the message (docs/architecture.md §11).
pub const PROP_TRACEPARENT: &str = "traceparent";

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OutgoingMessage {
    pub topic: String,
    pub tag: String,
    /// The first key is the primary one (`reservation_id` for order creation).
    pub keys: Vec<String>,
    pub properties: Vec<(String, String)>,
    pub body: Vec<u8>,
    /// Broker timer delivery (ms since the epoch). Not allowed in batches.
    pub deliver_time_ms: Option<u64>,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SendReceipt {
    /// The client's unique key (comma-joined for a batch).
    pub broker_msg_id: String,
    pub offset_msg_id: Option<String>,
    pub queue_id: Option<i32>,
    pub queue_offset: u64,
}

/// The outcome of one bounded send (docs/architecture.md §6). Every message of a batch
/// takes the batch's outcome.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "outcome", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum SendOutcome {
    Confirmed(SendReceipt),
    /// Possibly stored: stay pending, re-send with the same `message_id`,
    /// never compensate.
    Unknown {
        cause: UnknownCause,
        detail: String,
    },
    /// Certainly not stored and never will be: compensate.
    DefiniteFailure {
        cause: DefiniteCause,
        detail: String,
    },
}

impl SendOutcome {
    pub fn is_confirmed(&self) -> bool {
        matches!(self, SendOutcome::Confirmed(_))
    }

    pub fn label(&self) -> &'static str {
        match self {
            SendOutcome::Confirmed(_) => "CONFIRMED",
            SendOutcome::Unknown { .. } => "UNKNOWN",
            SendOutcome::DefiniteFailure { .. } => "DEFINITE_FAILURE",
        }
    }
}

/// A message as a consumer sees it, copied out of the client's types.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct IncomingMessage {
    pub topic: String,
    pub tag: Option<String>,
    pub keys: Vec<String>,
    /// Every property, system and user, by name.
    pub properties: BTreeMap<String, String>,
    #[serde(skip)]
    pub body: Vec<u8>,
    /// The broker's offset id: for locating only, never for idempotency.
    pub broker_msg_id: String,
    pub queue_id: i32,
    pub queue_offset: i64,
    /// 0 on first delivery (docs/architecture.md §3, `delivery_attempt`).
    pub reconsume_times: i32,
    pub store_timestamp_ms: i64,
    pub born_timestamp_ms: i64,
}

impl IncomingMessage {
    pub fn property(&self, name: &str) -> Option<&str> {
        self.properties.get(name).map(String::as_str)
    }

    /// The business message id carried as a user property.
    pub fn message_id(&self) -> Option<&str> {
        self.property(PROP_MESSAGE_ID)
    }
}

/// What a handler tells the broker about a whole listener batch.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub enum ConsumeVerdict {
    /// Commit the offset. Only after the business effect is durable.
    Ack,
    /// Redeliver later (bounded by the group's max reconsume times, then DLQ).
    Retry,
}

/// The consumer side of the boundary: what a push consumer calls for each
/// listener batch. It runs on the engine's runtime.
pub trait Handler: Send + Sync + 'static {
    fn handle(&self, batch: Vec<IncomingMessage>) -> impl Future<Output = ConsumeVerdict> + Send;
}

/// The producer side of the boundary.
pub trait Producer: Clone + Send + Sync + 'static {
    /// One bounded synchronous send.
    fn send(
        &self,
        msg: OutgoingMessage,
        timeout: Duration,
    ) -> impl Future<Output = SendOutcome> + Send;

    /// One request carrying every message (same topic, no delivery time).
    fn send_batch(
        &self,
        msgs: Vec<OutgoingMessage>,
        timeout: Duration,
    ) -> impl Future<Output = SendOutcome> + Send;
}

/// Where a new consumer group starts reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum StartFrom {
    First,
    Last,
}

/// Everything that shapes one push consumer.
#[derive(Debug, Clone)]
pub struct ConsumerSpec {
    pub group: String,
    pub topic: String,
    /// A tag expression, `*` for all.
    pub tags: String,
    /// Listener concurrency: the real bound (ROCKETMQ.md, Push consumer).
    pub threads: u32,
    /// Messages handed to one listener call (and one PG transaction).
    pub batch_max: u32,
    pub pull_batch: u32,
    pub pull_threshold_per_queue: u32,
    pub max_reconsume_times: i32,
    pub start_from: StartFrom,
    /// Told whether a rebalance has assigned this consumer queues of
    /// `topic`, i.e. whether it pulls. Until then messages wait in the
    /// broker, which is what a daemon's readiness must say (see `daemon`).
    pub assigned: Option<tokio::sync::watch::Sender<bool>>,
    /// Where the consumer has got to in each queue, for `/v1/stats`
    /// (docs/architecture.md §10.4).
    pub positions: Option<std::sync::Arc<position::Positions>>,
    /// Counts every delivery by topic, group and answer (§11.1).
    pub meters: Option<crate::domain::meters::Meters>,
}

impl ConsumerSpec {
    pub fn new(group: impl Into<String>, topic: impl Into<String>) -> Self {
        Self {
            group: group.into(),
            topic: topic.into(),
            tags: "*".into(),
            threads: 4,
            batch_max: 1,
            pull_batch: 32,
            pull_threshold_per_queue: 200,
            max_reconsume_times: 3,
            start_from: StartFrom::First,
            assigned: None,
            positions: None,
            meters: None,
        }
    }
}

/// A topic to create or update (idempotent).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct TopicSpec {
    pub name: String,
    pub queues: u32,
    pub topic_type: TopicType,
}

/// Consumer lag of one group on one topic (docs/architecture.md §10).
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Lag {
    /// Σ (broker offset − consumer offset) over the queues.
    pub messages: i64,
    /// Age of the oldest unconsumed message: max per-queue `delay_time`.
    pub seconds: f64,
}

/// [`Lag`] with what rates and the expiry view need.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct LagDetail {
    pub messages: i64,
    pub seconds: f64,
    /// Σ broker offsets over the queues: grows with every message produced.
    pub broker_offsets: i64,
    /// Σ consumer offsets: grows with every message consumed.
    pub consumer_offsets: i64,
    /// Unconsumed messages at the head of each queue (a bounded probe).
    pub heads: Vec<IncomingMessage>,
    /// The same lag, broker by broker (two brokers are first-class:
    /// docs/scaling.md), by broker name.
    pub per_broker: Vec<BrokerLag>,
    /// The same lag, queue by queue: what a daemon's `mq_consumer_ready`
    /// sums over the queues its client was assigned (§11.1).
    pub queues: Vec<QueueBacklog>,
}

/// Messages after a group's consumer offset in one queue.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct QueueBacklog {
    pub topic: String,
    pub broker: String,
    pub queue_id: i32,
    pub messages: i64,
}

/// One broker's part of a group's lag.
#[derive(Debug, Clone, Default, PartialEq, Serialize, serde::Deserialize)]
pub struct BrokerLag {
    pub broker: String,
    pub messages: i64,
    pub seconds: f64,
}

/// Adds `b`'s lag of a broker into `into` (pure): messages add up, the
/// wait is the longest; one entry per broker, by name.
pub fn merge_broker_lag(into: &mut Vec<BrokerLag>, b: &BrokerLag) {
    match into.iter_mut().find(|x| x.broker == b.broker) {
        Some(x) => {
            x.messages += b.messages;
            x.seconds = x.seconds.max(b.seconds);
        }
        None => into.push(b.clone()),
    }
    into.sort_by(|a, b| a.broker.cmp(&b.broker));
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct BrokerInfo {
    pub cluster: String,
    pub name: String,
    pub addr: String,
}

/// Creates or updates every topic of docs/architecture.md §3 (with its queue count and
/// type) and every consumer group (with `retryMaxTimes`), then waits until
/// the NameServer routes each topic, so a producer can send at once.
/// Idempotent: a second run changes nothing.
pub async fn setup(
    admin: &rocket::RocketAdmin,
    names: &Names,
    retry_max_times: i32,
) -> Result<Vec<String>, rocket::MqError> {
    let mut done = Vec::new();
    for kind in TopicKind::ALL {
        let spec = TopicSpec {
            name: names.topic(kind),
            queues: kind.queues(),
            topic_type: kind.topic_type(),
        };
        admin.ensure_topic(&spec).await?;
        admin
            .ensure_group(&names.group(kind), retry_max_times)
            .await?;
        done.push(format!(
            "topic {} ({} queues, {:?}) and group {} (retryMaxTimes {})",
            spec.name,
            spec.queues,
            spec.topic_type,
            names.group(kind),
            retry_max_times
        ));
    }
    // The broker registers new topics with the NameServer on its next
    // heartbeat; wait for the routes rather than let the first send fail.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    for kind in TopicKind::ALL {
        let topic = names.topic(kind);
        while !admin.has_route(&topic).await? {
            if std::time::Instant::now() > deadline {
                return Err(rocket::MqError::NoRoute { topic });
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
    Ok(done)
}

#[cfg(test)]
mod tests {
    #[test]
    fn broker_lags_merge_by_name_adding_messages_and_keeping_the_longest_wait() {
        let lag = |b: &str, messages, seconds| super::BrokerLag {
            broker: b.into(),
            messages,
            seconds,
        };
        let mut all = Vec::new();
        super::merge_broker_lag(&mut all, &lag("broker-b", 3, 1.0));
        super::merge_broker_lag(&mut all, &lag("broker-a", 2, 4.0));
        super::merge_broker_lag(&mut all, &lag("broker-b", 5, 2.5));
        assert_eq!(all, vec![lag("broker-a", 2, 4.0), lag("broker-b", 8, 2.5)]);
    }
}
