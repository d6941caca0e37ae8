//! Topic and consumer-group names of docs/architecture.md §3, under a configurable prefix.

use crate::domain::message::MessageKind;
use serde::Serialize;

/// One of the four seckill topics.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
pub enum TopicKind {
    OrderCreate,
    OrderTimeout,
    OrderEvent,
    InventoryCompensate,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum TopicType {
    Normal,
    Delay,
}

impl TopicKind {
    pub const ALL: [TopicKind; 4] = [
        TopicKind::OrderCreate,
        TopicKind::OrderTimeout,
        TopicKind::OrderEvent,
        TopicKind::InventoryCompensate,
    ];

    /// Its consumer records each message it applied in `consumer_inbox`:
    /// all but the projection, which compares aggregate versions
    /// (docs/architecture.md §8.7).
    pub fn has_inbox(self) -> bool {
        self != TopicKind::OrderEvent
    }

    pub fn base_name(self) -> &'static str {
        match self {
            TopicKind::OrderCreate => "PROD_SECKILL_ORDER_CREATE_V1",
            TopicKind::OrderTimeout => "PROD_SECKILL_ORDER_TIMEOUT_V1",
            TopicKind::OrderEvent => "PROD_SECKILL_ORDER_EVENT_V1",
            TopicKind::InventoryCompensate => "PROD_SECKILL_INVENTORY_COMPENSATE_V1",
        }
    }

    /// The consuming group: exactly one per topic here (docs/architecture.md §3).
    pub fn group_base_name(self) -> &'static str {
        match self {
            TopicKind::OrderCreate => "CG_SECKILL_ORDER_CREATE_PG_V1",
            TopicKind::OrderTimeout => "CG_SECKILL_ORDER_TIMEOUT_V1",
            TopicKind::OrderEvent => "CG_SECKILL_ORDER_QUERY_PROJECTION_V1",
            TopicKind::InventoryCompensate => "CG_SECKILL_INVENTORY_COMPENSATE_V1",
        }
    }

    /// The starting queue counts (docs/architecture.md §3.1): 64, 32, 32 and 64.
    pub fn queues(self) -> u32 {
        match self {
            TopicKind::OrderCreate => 64,
            TopicKind::OrderTimeout => 32,
            TopicKind::InventoryCompensate => 32,
            TopicKind::OrderEvent => 64,
        }
    }

    /// The body every message of the topic carries.
    pub fn message_kind(self) -> MessageKind {
        match self {
            TopicKind::OrderCreate => MessageKind::OrderCreate,
            TopicKind::OrderTimeout => MessageKind::Cancel,
            TopicKind::OrderEvent => MessageKind::OrderEvent,
            TopicKind::InventoryCompensate => MessageKind::Release,
        }
    }

    pub fn topic_type(self) -> TopicType {
        match self {
            TopicKind::OrderTimeout => TopicType::Delay,
            _ => TopicType::Normal,
        }
    }

    pub fn tags(self) -> &'static [&'static str] {
        match self {
            TopicKind::OrderCreate => &["CREATE_ORDER"],
            TopicKind::OrderTimeout => &["CANCEL_IF_UNPAID"],
            TopicKind::OrderEvent => &["ORDER_CREATED", "ORDER_PAID", "ORDER_CANCELED"],
            TopicKind::InventoryCompensate => &["RELEASE_RESERVATION"],
        }
    }
}

/// Who sends. Each is its own producer group, so the broker's view of
/// producers tells an operator's replay from the engine's own traffic
/// (docs/architecture.md §9.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Sender {
    Engine,
    /// `seckillctl dlq replay --direct` (the break glass). Replays through
    /// the operator API, the CLI's and the TUI's, go out on the engine's
    /// own producer.
    CliReplay,
}

impl Sender {
    pub fn group_base_name(self) -> &'static str {
        match self {
            Sender::Engine => "PG_SECKILL_ENGINE_V1",
            Sender::CliReplay => "PG_SECKILL_REPLAY_V1",
        }
    }
}

/// Resolved names for one prefix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Names {
    prefix: String,
}

impl Names {
    pub fn new(prefix: impl Into<String>) -> Self {
        Self {
            prefix: prefix.into(),
        }
    }

    pub fn prefix(&self) -> &str {
        &self.prefix
    }

    pub fn topic(&self, kind: TopicKind) -> String {
        format!("{}{}", self.prefix, kind.base_name())
    }

    pub fn group(&self, kind: TopicKind) -> String {
        format!("{}{}", self.prefix, kind.group_base_name())
    }

    /// Producer group for the engine's publishers.
    pub fn producer_group(&self) -> String {
        self.producer_group_of(Sender::Engine)
    }

    /// Producer group of one kind of sender.
    pub fn producer_group_of(&self, sender: Sender) -> String {
        format!("{}{}", self.prefix, sender.group_base_name())
    }

    pub fn dlq_topic(&self, kind: TopicKind) -> String {
        dlq_topic(&self.group(kind))
    }

    pub fn retry_topic(&self, kind: TopicKind) -> String {
        retry_topic(&self.group(kind))
    }
}

pub fn dlq_topic(group: &str) -> String {
    format!("%DLQ%{group}")
}

pub fn retry_topic(group: &str) -> String {
    format!("%RETRY%{group}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_the_prefix() {
        let n = Names::new("T1_");
        assert_eq!(
            n.topic(TopicKind::OrderCreate),
            "T1_PROD_SECKILL_ORDER_CREATE_V1"
        );
        assert_eq!(
            n.dlq_topic(TopicKind::OrderCreate),
            "%DLQ%T1_CG_SECKILL_ORDER_CREATE_PG_V1"
        );
        assert_eq!(TopicKind::ALL.iter().map(|k| k.queues()).sum::<u32>(), 192);
        assert_eq!(
            n.producer_group_of(Sender::CliReplay),
            "T1_PG_SECKILL_REPLAY_V1"
        );
    }
}
