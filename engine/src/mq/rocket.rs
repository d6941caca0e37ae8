//! The rocketmq-rust 1.0.0 implementation of the boundary in [`super`].
//! Every call is bounded by a deadline of ours as well as the client's, so a
//! hung connection is reported rather than waited on.

use super::classify::{DefiniteCause, FailureKind, UnknownCause, classify};
use super::position::{Positions, QueueKey};
use super::{
    BrokerInfo, ConsumeVerdict, ConsumerSpec, Handler, IncomingMessage, Lag, LagDetail,
    OutgoingMessage, Producer, SendOutcome, SendReceipt, StartFrom, TopicSpec, TopicType,
};
use crate::domain::meters::{Answer, Meters};
use rocketmq_client_rust::{ArcMessageQueueListener, MessageQueueListener};
use rocketmq_client_rust::{
    BrokerAdmin, ClientError, ClientResult, ClientRuntime, ConsumeConcurrentlyContext,
    ConsumeConcurrentlyStatus, ConsumerAdmin, DefaultMQAdminExt, DefaultMQProducer,
    DefaultMQPushConsumer, MQPushConsumer, MessageListenerConcurrently, PullStatus, RouteAdmin,
    SendStatus, TopicAdmin,
};
use rocketmq_model::common::config::TopicConfig;
use rocketmq_model::common::consumer::consume_from_where::ConsumeFromWhere;
use rocketmq_model::common::message::message_ext::MessageExt;
use rocketmq_model::common::message::message_queue::MessageQueue;
use rocketmq_model::common::message::message_single::Message;
use rocketmq_protocol::protocol::subscription::subscription_group_config::SubscriptionGroupConfig;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, thiserror::Error)]
pub enum MqError {
    #[error("{op} failed: {source}")]
    Client {
        op: &'static str,
        source: ClientError,
    },
    #[error("{op} did not answer within {after:?}")]
    Timeout { op: &'static str, after: Duration },
    #[error(
        "no broker is registered with the NameServer at {namesrv}; is the broker up? (`./scripts/stack.sh up`)"
    )]
    NoBroker { namesrv: String },
    #[error(
        "the NameServer has no route for topic {topic} a minute after it was created; check the broker log"
    )]
    NoRoute { topic: String },
}

impl MqError {
    /// The broker or NameServer says the topic does not exist (a DLQ topic
    /// before its first dead message, say): nothing to read, not an outage.
    pub fn is_missing_topic(&self) -> bool {
        match self {
            MqError::Client { source, .. } => {
                // The code sits on a nested cause; read the whole chain.
                let mut text = String::new();
                let mut cause: Option<&dyn std::error::Error> = Some(source);
                while let Some(c) = cause {
                    text.push_str(&c.to_string().to_ascii_lowercase());
                    text.push('\n');
                    cause = c.source();
                }
                source.broker_response_code() == Some(17)
                    || text.contains("code: 17 ")
                    || text.contains("not exist")
            }
            _ => false,
        }
    }
}

/// Runs `fut` under a deadline, naming the operation in the error.
async fn bounded<T>(
    op: &'static str,
    after: Duration,
    fut: impl Future<Output = ClientResult<T>>,
) -> Result<T, MqError> {
    // Boxed: the client's futures are deep enough to overflow the compiler's
    // layout recursion limit in every crate that awaits them.
    match tokio::time::timeout(after, Box::pin(fut)).await {
        Ok(Ok(v)) => Ok(v),
        Ok(Err(source)) => Err(MqError::Client { op, source }),
        Err(_) => Err(MqError::Timeout { op, after }),
    }
}

fn to_message(m: OutgoingMessage) -> Result<Message, rocketmq_error::Error> {
    let mut b = Message::builder().topic(m.topic).tags(m.tag);
    if !m.keys.is_empty() {
        b = b.keys(m.keys);
    }
    for (k, v) in m.properties {
        b = b.raw_property(k, v)?;
    }
    if let Some(at) = m.deliver_time_ms {
        b = b.deliver_time_ms(at);
    }
    b.body(m.body).build()
}

fn failure(e: &ClientError) -> SendOutcome {
    match classify(e) {
        FailureKind::Unknown(cause) => SendOutcome::Unknown {
            cause,
            detail: e.to_string(),
        },
        FailureKind::Definite(cause) => SendOutcome::DefiniteFailure {
            cause,
            detail: e.to_string(),
        },
    }
}

fn receipt(r: rocketmq_client_rust::SendResult) -> SendOutcome {
    let receipt = SendReceipt {
        broker_msg_id: r.msg_id.as_ref().map(|s| s.to_string()).unwrap_or_default(),
        offset_msg_id: r.offset_msg_id.clone(),
        queue_id: r.message_queue.as_ref().map(|q| q.queue_id()),
        queue_offset: r.queue_offset,
    };
    match r.send_status {
        SendStatus::SendOk => SendOutcome::Confirmed(receipt),
        other => SendOutcome::Unknown {
            cause: UnknownCause::NotDurable,
            detail: format!("broker stored the message with status {other:?}"),
        },
    }
}

/// A started producer. Clones share one client; sends take `&self`.
#[derive(Clone)]
pub struct RocketProducer {
    inner: DefaultMQProducer,
    /// Every send counted by topic and outcome (docs/architecture.md
    /// §11.1); the daemon's producer has them, a CLI's does not.
    meters: Option<Meters>,
}

impl RocketProducer {
    pub async fn start(
        rt: Arc<ClientRuntime>,
        namesrv: &str,
        group: &str,
        default_timeout: Duration,
        retries: u32,
    ) -> Result<Self, MqError> {
        let mut inner = DefaultMQProducer::builder(rt)
            .producer_group(group.to_owned())
            .name_server_addr(namesrv.to_owned())
            .send_msg_timeout(default_timeout.as_millis() as u32)
            .retry_times_when_send_failed(retries)
            .build();
        Box::pin(inner.start())
            .await
            .map_err(|source| MqError::Client {
                op: "producer start",
                source,
            })?;
        Ok(Self {
            inner,
            meters: None,
        })
    }

    /// Counts every send of this producer and its clones into `meters`.
    pub fn with_meters(self, meters: Meters) -> Self {
        Self {
            meters: Some(meters),
            ..self
        }
    }

    fn count(&self, topic: &str, n: usize, outcome: &SendOutcome, started: std::time::Instant) {
        if let Some(m) = &self.meters {
            m.sent(topic, outcome.label(), n as u64, started.elapsed());
        }
    }

    /// Stops the shared client (every clone).
    pub async fn shutdown(mut self) {
        Box::pin(self.inner.shutdown()).await;
    }
}

impl Producer for RocketProducer {
    async fn send(&self, msg: OutgoingMessage, timeout: Duration) -> SendOutcome {
        let (topic, started) = (msg.topic.clone(), std::time::Instant::now());
        let outcome = self.send_one(msg, timeout).await;
        self.count(&topic, 1, &outcome, started);
        outcome
    }

    async fn send_batch(&self, msgs: Vec<OutgoingMessage>, timeout: Duration) -> SendOutcome {
        let topic = msgs.first().map(|m| m.topic.clone()).unwrap_or_default();
        let (n, started) = (msgs.len(), std::time::Instant::now());
        let outcome = self.send_many(msgs, timeout).await;
        self.count(&topic, n, &outcome, started);
        outcome
    }
}

impl RocketProducer {
    async fn send_one(&self, msg: OutgoingMessage, timeout: Duration) -> SendOutcome {
        let msg = match to_message(msg) {
            Ok(m) => m,
            Err(e) => {
                return SendOutcome::DefiniteFailure {
                    cause: DefiniteCause::InvalidArgument,
                    detail: e.to_string(),
                };
            }
        };
        // Our own deadline is a safety net a little past the client's: if it
        // fires, the request may be in flight, so the outcome is UNKNOWN.
        let guard = timeout + Duration::from_millis(500);
        let send = Box::pin(
            self.inner
                .send_with_timeout(msg, timeout.as_millis() as u64),
        );
        match tokio::time::timeout(guard, send).await {
            Ok(Ok(Some(r))) => receipt(r),
            Ok(Ok(None)) => SendOutcome::Unknown {
                cause: UnknownCause::Unrecognized,
                detail: "synchronous send returned no result".into(),
            },
            Ok(Err(e)) => failure(&e),
            Err(_) => SendOutcome::Unknown {
                cause: UnknownCause::Timeout,
                detail: format!("no answer within {guard:?}"),
            },
        }
    }

    async fn send_many(&self, msgs: Vec<OutgoingMessage>, timeout: Duration) -> SendOutcome {
        if msgs.is_empty() {
            return SendOutcome::DefiniteFailure {
                cause: DefiniteCause::InvalidArgument,
                detail: "empty batch".into(),
            };
        }
        let mut built = Vec::with_capacity(msgs.len());
        for m in msgs {
            if m.deliver_time_ms.is_some() {
                return SendOutcome::DefiniteFailure {
                    cause: DefiniteCause::InvalidArgument,
                    detail: "delayed messages cannot be batched".into(),
                };
            }
            match to_message(m) {
                Ok(m) => built.push(m),
                Err(e) => {
                    return SendOutcome::DefiniteFailure {
                        cause: DefiniteCause::InvalidArgument,
                        detail: e.to_string(),
                    };
                }
            }
        }
        let guard = timeout + Duration::from_millis(500);
        let send = Box::pin(
            self.inner
                .send_batch_with_timeout(built, timeout.as_millis() as u64),
        );
        match tokio::time::timeout(guard, send).await {
            Ok(Ok(r)) => receipt(r),
            Ok(Err(e)) => failure(&e),
            Err(_) => SendOutcome::Unknown {
                cause: UnknownCause::Timeout,
                detail: format!("no answer within {guard:?}"),
            },
        }
    }
}

fn incoming(m: &MessageExt) -> IncomingMessage {
    let properties: BTreeMap<String, String> = m
        .properties()
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    let keys = properties
        .get("KEYS")
        .map(|k| {
            k.split(' ')
                .filter(|s| !s.is_empty())
                .map(str::to_owned)
                .collect()
        })
        .unwrap_or_default();
    IncomingMessage {
        topic: m.topic().to_string(),
        tag: properties.get("TAGS").cloned(),
        keys,
        properties,
        body: m.body().map(|b| b.to_vec()).unwrap_or_default(),
        broker_msg_id: m.msg_id().to_string(),
        queue_id: m.queue_id(),
        queue_offset: m.queue_offset(),
        reconsume_times: m.reconsume_times(),
        store_timestamp_ms: m.store_timestamp(),
        born_timestamp_ms: m.born_timestamp(),
    }
}

/// Bridges the client's synchronous listener to an async [`Handler`].
struct Listener<H> {
    handler: Arc<H>,
    rt: tokio::runtime::Handle,
    group: String,
    /// Where each queue has got to (`None`: not tracked).
    positions: Option<Arc<Positions>>,
    /// Deliveries counted by topic, group and answer (§11.1).
    meters: Option<Meters>,
}

impl<H: Handler> MessageListenerConcurrently for Listener<H> {
    fn consume_message(
        &self,
        msgs: &[&MessageExt],
        ctx: &ConsumeConcurrentlyContext,
    ) -> ClientResult<ConsumeConcurrentlyStatus> {
        let batch: Vec<IncomingMessage> = msgs.iter().map(|m| incoming(m)).collect();
        let q = ctx.get_message_queue();
        let topic = q.topic().to_string();
        // One listener call holds one queue's messages, in offset order.
        let span = batch
            .iter()
            .map(|m| m.queue_offset)
            .fold(None, |r: Option<(i64, i64)>, o| {
                Some(r.map_or((o, o + 1), |(a, b)| (a.min(o), b.max(o + 1))))
            });
        let lane = self.positions.as_ref().zip(span).map(|(p, span)| {
            let key = QueueKey {
                group: self.group.clone(),
                topic: topic.clone(),
                broker: q.broker_name().to_string(),
                queue_id: q.queue_id(),
            };
            p.started(key.clone(), span.0);
            (p, key, span)
        });
        let n = batch.len() as u64;
        if let Some(m) = &self.meters {
            m.handed(&self.group, &topic, n);
        }
        let started = std::time::Instant::now();
        let handler = self.handler.clone();
        // The listener runs on a blocking thread of the engine's runtime
        // (ROCKETMQ.md), so blocking on the runtime here is allowed. The
        // handler runs as its own task: a panic in it becomes a retry, never
        // an ACK and never a dead listener thread.
        let verdict = self
            .rt
            .block_on(self.rt.spawn(async move { handler.handle(batch).await }));
        // A retry is answered too: the client sends the batch back to
        // `%RETRY%` and moves on (its lag is measured there).
        if let Some((p, key, (start, end))) = lane {
            p.answered(key, start, end);
        }
        let answer = match &verdict {
            Ok(ConsumeVerdict::Ack) => Answer::Ack,
            Ok(ConsumeVerdict::Retry) => Answer::Retry,
            Err(_) => Answer::Failed,
        };
        if let Some(m) = &self.meters {
            m.answered(&self.group, &topic, n, answer, started.elapsed());
        }
        Ok(match verdict {
            Ok(ConsumeVerdict::Ack) => ConsumeConcurrentlyStatus::ConsumeSuccess,
            Ok(ConsumeVerdict::Retry) => ConsumeConcurrentlyStatus::ReconsumeLater,
            Err(e) => {
                tracing::error!(error = %e, "consumer handler panicked; asking for redelivery");
                ConsumeConcurrentlyStatus::ReconsumeLater
            }
        })
    }
}

/// A started push consumer.
pub struct RocketConsumer {
    inner: DefaultMQPushConsumer,
    group: String,
}

/// Hears the client's rebalances. It tells [`ConsumerSpec::assigned`]
/// whether this consumer got queues of its topic (the retry topic it also
/// subscribes to does not count), and drops the positions of queues that
/// moved. The client calls it after the new queues' pull requests are
/// dispatched, and only for a changed assignment.
struct Assigned {
    group: String,
    topic: String,
    tell: Option<tokio::sync::watch::Sender<bool>>,
    positions: Option<Arc<Positions>>,
}

impl MessageQueueListener for Assigned {
    fn message_queue_changed(
        &self,
        topic: &str,
        _all: &HashSet<MessageQueue>,
        assigned: &HashSet<MessageQueue>,
    ) {
        if let Some(p) = &self.positions {
            let queues = assigned
                .iter()
                .map(|q| (q.broker_name().to_string(), q.queue_id()))
                .collect();
            p.reassigned(&self.group, topic, queues);
        }
        if let Some(tell) = self.tell.as_ref().filter(|_| topic == self.topic) {
            tell.send_replace(!assigned.is_empty());
        }
    }
}

impl RocketConsumer {
    pub async fn start<H: Handler>(
        rt: Arc<ClientRuntime>,
        namesrv: &str,
        spec: &ConsumerSpec,
        handler: Arc<H>,
    ) -> Result<Self, MqError> {
        // The broker learns consumed offsets on this period; every lag and
        // consume-rate figure (docs/architecture.md §10) is at most this stale. The
        // client's default is 5 s; 1 s is its minimum.
        let mut client = rocketmq_client_rust::ClientConfig::default();
        client.set_persist_consumer_offset_interval(1_000);
        // Positions need every offset delivered: a tag filter leaves gaps.
        let positions = spec.positions.clone().filter(|_| spec.tags == "*");
        let mut inner = DefaultMQPushConsumer::builder(rt)
            .client_config(client)
            .consumer_group(spec.group.clone())
            .name_server_addr(namesrv.to_owned())
            .consume_thread_min(spec.threads)
            .consume_thread_max(spec.threads)
            .pull_batch_size(spec.pull_batch)
            .pull_threshold_for_queue(spec.pull_threshold_per_queue)
            .consume_message_batch_max_size(spec.batch_max)
            .max_reconsume_times(spec.max_reconsume_times)
            .consume_from_where(match spec.start_from {
                StartFrom::First => ConsumeFromWhere::ConsumeFromFirstOffset,
                StartFrom::Last => ConsumeFromWhere::ConsumeFromLastOffset,
            })
            // The assignment is recorded even under a tag filter: it is what
            // `mq_consumer_ready` sums over (§11.1).
            .message_queue_listener((spec.assigned.is_some() || spec.positions.is_some()).then(
                || {
                    Arc::new(Assigned {
                        group: spec.group.clone(),
                        topic: spec.topic.clone(),
                        tell: spec.assigned.clone(),
                        positions: spec.positions.clone(),
                    }) as ArcMessageQueueListener
                },
            ))
            .build();
        Box::pin(inner.subscribe(spec.topic.clone(), spec.tags.clone()))
            .await
            .map_err(|source| MqError::Client {
                op: "subscribe",
                source,
            })?;
        if let Some(m) = &spec.meters {
            m.declare_consumer(&spec.group, &spec.topic);
        }
        inner.register_message_listener_concurrently(Listener {
            handler,
            rt: tokio::runtime::Handle::current(),
            group: spec.group.clone(),
            positions,
            meters: spec.meters.clone(),
        });
        Box::pin(inner.start())
            .await
            .map_err(|source| MqError::Client {
                op: "consumer start",
                source,
            })?;
        Ok(Self {
            inner,
            group: spec.group.clone(),
        })
    }

    pub fn group(&self) -> &str {
        &self.group
    }

    pub async fn shutdown(mut self) {
        Box::pin(self.inner.shutdown()).await;
    }
}

/// Messages read straight from a queue, and where to continue.
#[derive(Debug, Clone)]
pub struct Pulled {
    pub messages: Vec<IncomingMessage>,
    pub next_offset: i64,
}

/// Min and max offsets of one queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct QueueOffsets {
    pub queue_id: i32,
    pub min: i64,
    pub max: i64,
}

/// Topic, group and lag administration, and the probes `health` uses.
pub struct RocketAdmin {
    inner: DefaultMQAdminExt,
    namesrv: String,
    timeout: Duration,
}

impl RocketAdmin {
    /// Starting does not contact the NameServer; the first call does.
    pub async fn start(
        rt: Arc<ClientRuntime>,
        namesrv: &str,
        timeout: Duration,
    ) -> Result<Self, MqError> {
        let mut inner = DefaultMQAdminExt::with_timeout(rt, timeout);
        inner.set_namesrv_addr(namesrv);
        Box::pin(inner.start())
            .await
            .map_err(|source| MqError::Client {
                op: "admin start",
                source,
            })?;
        Ok(Self {
            inner,
            namesrv: namesrv.to_owned(),
            timeout,
        })
    }

    pub async fn shutdown(mut self) {
        Box::pin(self.inner.shutdown()).await;
    }

    pub fn namesrv(&self) -> &str {
        &self.namesrv
    }

    /// One cheap request to the NameServer.
    pub async fn ping_namesrv(&self) -> Result<(), MqError> {
        bounded(
            "NameServer probe",
            self.timeout,
            self.inner.probe_name_server(self.namesrv.clone().into()),
        )
        .await
    }

    /// Master brokers registered with the NameServer.
    pub async fn brokers(&self) -> Result<Vec<BrokerInfo>, MqError> {
        let info = bounded(
            "cluster info",
            self.timeout,
            self.inner.examine_broker_cluster_info(),
        )
        .await?;
        let mut clusters: BTreeMap<String, String> = BTreeMap::new();
        for (cluster, names) in info.cluster_addr_table.clone().unwrap_or_default() {
            for name in names {
                clusters.insert(name.to_string(), cluster.to_string());
            }
        }
        let mut out = Vec::new();
        for (name, data) in info.broker_addr_table.unwrap_or_default() {
            if let Some(addr) = data.broker_addrs().get(&0) {
                out.push(BrokerInfo {
                    cluster: clusters.get(name.as_str()).cloned().unwrap_or_default(),
                    name: name.to_string(),
                    addr: addr.to_string(),
                });
            }
        }
        out.sort_by(|a, b| a.name.cmp(&b.name));
        Ok(out)
    }

    async fn master_addrs(&self) -> Result<Vec<String>, MqError> {
        let brokers = self.brokers().await?;
        if brokers.is_empty() {
            return Err(MqError::NoBroker {
                namesrv: self.namesrv.clone(),
            });
        }
        Ok(brokers.into_iter().map(|b| b.addr).collect())
    }

    /// The broker's runtime stats, from the broker itself (not the
    /// NameServer's possibly stale view). Not cheap for the broker: never
    /// call it on every tick of a loop.
    async fn runtime_stats(&self, addr: &str) -> Result<HashMap<String, String>, MqError> {
        let kv = bounded(
            "broker runtime stats",
            self.timeout,
            self.inner
                .fetch_broker_runtime_stats(addr.to_owned().into()),
        )
        .await?;
        Ok(kv
            .table
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect())
    }

    /// The broker's version, from the broker itself.
    pub async fn broker_version(&self, addr: &str) -> Result<String, MqError> {
        let kv = self.runtime_stats(addr).await?;
        Ok(kv
            .get("brokerVersionDesc")
            .or_else(|| kv.get("brokerVersion"))
            .cloned()
            .unwrap_or_else(|| "?".into()))
    }

    /// Creates or updates the topic on every master broker.
    pub async fn ensure_topic(&self, spec: &TopicSpec) -> Result<(), MqError> {
        for addr in self.master_addrs().await? {
            let mut tc = TopicConfig::with_queues(spec.name.as_str(), spec.queues, spec.queues);
            if spec.topic_type == TopicType::Delay {
                // The leading '+' is required, or the broker drops every attribute.
                tc.attributes.insert("+message.type".into(), "DELAY".into());
            }
            bounded(
                "create topic",
                self.timeout,
                self.inner.create_and_update_topic_config(addr.into(), tc),
            )
            .await?;
        }
        Ok(())
    }

    /// Deletes from every master broker the topics whose name contains
    /// `needle` (a test's or drill's own prefix, which its retry and DLQ
    /// topics carry too), so their consume-queue files go with them.
    /// Returns how many it deleted.
    pub async fn delete_topics_containing(&self, needle: &str) -> Result<usize, MqError> {
        if needle.is_empty() {
            return Ok(0);
        }
        let all = bounded(
            "list topics",
            self.timeout,
            self.inner.fetch_all_topic_list(),
        )
        .await?;
        let doomed: Vec<cheetah_string::CheetahString> = all
            .topic_list
            .into_iter()
            .filter(|t| t.as_str().contains(needle))
            .collect();
        if doomed.is_empty() {
            return Ok(0);
        }
        let addrs: std::collections::HashSet<cheetah_string::CheetahString> = self
            .master_addrs()
            .await?
            .into_iter()
            .map(cheetah_string::CheetahString::from)
            .collect();
        let n = doomed.len();
        bounded(
            "delete topics",
            self.timeout,
            self.inner.delete_topic_in_broker_list(addrs, doomed),
        )
        .await?;
        Ok(n)
    }

    /// Creates or updates the consumer group on every master broker.
    pub async fn ensure_group(&self, group: &str, retry_max_times: i32) -> Result<(), MqError> {
        for addr in self.master_addrs().await? {
            let mut sg = SubscriptionGroupConfig::new(group.to_owned().into());
            sg.set_retry_max_times(retry_max_times);
            bounded(
                "create group",
                self.timeout,
                self.inner
                    .create_and_update_subscription_group_config(addr.into(), sg),
            )
            .await?;
        }
        Ok(())
    }

    /// Whether the NameServer has a route for `topic` (the broker has
    /// registered it).
    pub async fn has_route(&self, topic: &str) -> Result<bool, MqError> {
        let route = Box::pin(self.inner.examine_topic_route_info(topic.to_owned().into()));
        match tokio::time::timeout(self.timeout, route).await {
            Ok(Ok(Some(route))) => Ok(!route.queue_datas.is_empty()),
            Ok(Ok(None)) => Ok(false),
            Ok(Err(e)) if e.is(&rocketmq_error::ROUTE_TOPIC_NOT_FOUND) => Ok(false),
            Ok(Err(e)) if e.to_string().contains("No topic route") => Ok(false),
            Ok(Err(source)) => Err(MqError::Client {
                op: "topic route",
                source,
            }),
            Err(_) => Err(MqError::Timeout {
                op: "topic route",
                after: self.timeout,
            }),
        }
    }

    /// Lag of `group` on `topic` (docs/architecture.md §10).
    pub async fn lag(&self, topic: &str, group: &str) -> Result<Lag, MqError> {
        let d = self.lag_detail(topic, group, 1, usize::MAX).await?;
        Ok(Lag {
            messages: d.messages,
            seconds: d.seconds,
        })
    }

    /// Lag of `group` on `topic`, with the offset sums rates are computed
    /// from and up to `probe` unconsumed messages at the head of each queue
    /// (their bodies carry `reservation_valid_until`).
    ///
    /// `lag_seconds` is read from the message itself: for every queue with a
    /// backlog, the store time of the message at the consumer offset. The
    /// broker's `query_consume_time_span` reports 0 for queues whose offsets
    /// the group has not committed yet, which is exactly when a stuck
    /// consumer matters, so it is not used.
    pub async fn lag_detail(
        &self,
        topic: &str,
        group: &str,
        probe: i32,
        max_queues: usize,
    ) -> Result<LagDetail, MqError> {
        self.lag_detail_with(topic, group, probe, max_queues, &BTreeMap::new())
            .await
    }

    /// [`Self::lag_detail`], each queue counted from the further of the
    /// broker's committed offset and the consumer's own position there,
    /// keyed by (broker, queue), as daemons report them (§10.4).
    pub async fn lag_detail_with(
        &self,
        topic: &str,
        group: &str,
        probe: i32,
        max_queues: usize,
        positions: &BTreeMap<(String, i32), i64>,
    ) -> Result<LagDetail, MqError> {
        let mut d = LagDetail::default();
        let mut oldest_store_ms: Option<i64> = None;
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        let wait_s =
            |oldest: Option<i64>| oldest.map_or(0.0, |t| (now_ms - t).max(0) as f64 / 1000.0);
        for broker in self.brokers().await? {
            let mut here = super::BrokerLag {
                broker: broker.name.clone(),
                ..Default::default()
            };
            let mut oldest_here: Option<i64> = None;
            let stats = bounded(
                "consume stats",
                self.timeout,
                self.inner.examine_consume_stats(
                    group.to_owned().into(),
                    Some(topic.to_owned().into()),
                    None,
                    Some(broker.addr.clone().into()),
                    Some(self.timeout.as_millis() as u64),
                ),
            )
            .await?;
            let mut behind = Vec::new();
            for (mq, w) in &stats.offset_table {
                let head = w.get_broker_offset();
                // A consumer's own position, read just before, is fresher
                // than the offset it last told the broker (§10.4).
                let told = w.get_consumer_offset().max(0);
                let consumer = positions
                    .get(&(mq.broker_name().to_string(), mq.queue_id()))
                    .map_or(told, |p| told.max((*p).min(head)));
                d.broker_offsets += head;
                d.consumer_offsets += consumer.min(head);
                d.queues.push(super::QueueBacklog {
                    topic: mq.topic().to_string(),
                    broker: mq.broker_name().to_string(),
                    queue_id: mq.queue_id(),
                    messages: (head - consumer).max(0),
                });
                if head > consumer {
                    d.messages += head - consumer;
                    here.messages += head - consumer;
                    behind.push((mq, consumer, head - consumer));
                }
            }
            // Deepest queues first: with round-robin sends they hold the
            // oldest messages, so a bounded probe still finds the lag.
            behind.sort_by_key(|(_, _, n)| std::cmp::Reverse(*n));
            for (mq, consumer, _) in behind.into_iter().take(max_queues) {
                let pulled = self
                    .pull_at(
                        &broker.addr,
                        mq.topic().as_str(),
                        mq.broker_name().as_str(),
                        mq.queue_id(),
                        consumer,
                        probe.max(1),
                    )
                    .await?;
                if let Some(m) = pulled.messages.first() {
                    // A timer message (the delayed cancel) only becomes
                    // consumable at its delivery time: its wait starts there,
                    // not at the store time, or a 15-minute pay window would
                    // read as 15 minutes of lag.
                    let ready = m
                        .property("TIMER_DELIVER_MS")
                        .and_then(|v| v.parse::<i64>().ok())
                        .map_or(m.store_timestamp_ms, |at| at.max(m.store_timestamp_ms));
                    oldest_store_ms = Some(oldest_store_ms.map_or(ready, |o| o.min(ready)));
                    oldest_here = Some(oldest_here.map_or(ready, |o| o.min(ready)));
                }
                d.heads.extend(pulled.messages);
            }
            here.seconds = wait_s(oldest_here);
            super::merge_broker_lag(&mut d.per_broker, &here);
        }
        d.seconds = wait_s(oldest_store_ms);
        Ok(d)
    }

    /// The broker's uptime in seconds, when its runtime stats report a
    /// boot time (docs/architecture.md §10.8 "broker just recovered").
    pub async fn broker_uptime_s(&self, addr: &str) -> Result<Option<f64>, MqError> {
        let kv = self.runtime_stats(addr).await?;
        let now_ms = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as i64);
        Ok(kv
            .get("bootTimestamp")
            .and_then(|v| v.parse::<i64>().ok())
            .map(|boot| (now_ms - boot).max(0) as f64 / 1000.0))
    }

    /// Min and max offsets of every queue of `topic` on every master.
    pub async fn queue_offsets(&self, topic: &str) -> Result<Vec<(String, QueueOffsets)>, MqError> {
        let mut out = Vec::new();
        for addr in self.master_addrs().await? {
            let stats = bounded(
                "topic stats",
                self.timeout,
                self.inner
                    .examine_topic_stats(topic.to_owned().into(), Some(addr.clone().into())),
            )
            .await?;
            for (mq, off) in stats.get_offset_table() {
                out.push((
                    mq.broker_name().to_string(),
                    QueueOffsets {
                        queue_id: mq.queue_id(),
                        min: off.get_min_offset(),
                        max: off.get_max_offset(),
                    },
                ));
            }
        }
        out.sort_by_key(|(b, q)| (b.clone(), q.queue_id));
        Ok(out)
    }

    /// The messages of `topic` stored under `key` (the reservation id is
    /// every order message's first key) since `since_ms`, from the brokers'
    /// key index, at most `max`. A topic that does not exist yet (a
    /// `%RETRY%` or `%DLQ%` topic before its first message) holds none.
    pub async fn by_key(
        &self,
        topic: &str,
        key: &str,
        since_ms: i64,
        max: i32,
    ) -> Result<Vec<IncomingMessage>, MqError> {
        let now_ms = chrono::Utc::now().timestamp_millis();
        let found = bounded(
            "query by key",
            self.timeout,
            self.inner.query_message_by_key(
                None,
                topic.to_owned().into(),
                key.to_owned().into(),
                max,
                since_ms.max(0),
                now_ms + 60_000,
                rocketmq_model::common::message::MessageConst::INDEX_KEY_TYPE.into(),
                None,
            ),
        )
        .await;
        match found {
            Ok(r) => Ok(r.message_list().iter().map(incoming).collect()),
            Err(e) if e.is_missing_topic() => Ok(Vec::new()),
            Err(e) => Err(e),
        }
    }

    /// Reads up to `max` messages of one queue from `offset`, e.g. of a
    /// `%DLQ%<group>` topic, without consuming them.
    pub async fn pull(
        &self,
        broker_name: &str,
        topic: &str,
        queue_id: i32,
        offset: i64,
        max: i32,
    ) -> Result<Pulled, MqError> {
        let brokers = self.brokers().await?;
        let Some(broker) = brokers.iter().find(|b| b.name == broker_name) else {
            return Err(MqError::NoBroker {
                namesrv: self.namesrv.clone(),
            });
        };
        self.pull_at(&broker.addr, topic, broker_name, queue_id, offset, max)
            .await
    }

    async fn pull_at(
        &self,
        addr: &str,
        topic: &str,
        broker_name: &str,
        queue_id: i32,
        offset: i64,
        max: i32,
    ) -> Result<Pulled, MqError> {
        let mq = MessageQueue::from_parts(topic, broker_name, queue_id);
        let pr = bounded(
            "pull",
            self.timeout,
            self.inner.inner().pull_message_from_queue(
                addr,
                &mq,
                "*",
                offset,
                max,
                self.timeout.as_millis() as u64,
            ),
        )
        .await?;
        let messages = if *pr.pull_status() == PullStatus::Found {
            pr.msg_found_list()
                .unwrap_or(&[])
                .iter()
                .map(incoming)
                .collect()
        } else {
            Vec::new()
        };
        Ok(Pulled {
            messages,
            next_offset: pr.next_begin_offset() as i64,
        })
    }
}
