//! The query projection (docs/architecture.md §8.7): ORDER_EVENT into a Redis view per
//! reservation, so `GET /v1/reservations/{id}` shows PAID or CANCELED.
//!
//! Idempotent without an inbox: the view keeps the `aggregate_version` it
//! was written with and takes only a newer one, so a duplicate, a replay or
//! an out-of-order delivery of an older event changes nothing.

use super::{SettleEach, SettleError, handle_each};
use crate::domain::message::OrderEvent;
use crate::domain::message::{Malformed, parse_order_event};
use crate::domain::stats::LifecycleStats;
use crate::mq::{ConsumeVerdict, Handler, IncomingMessage, Names, TopicKind};
use crate::pipeline::trail;
use crate::reservation::ReservationStore;
use sqlx::PgPool;
use std::sync::Arc;

#[derive(Clone)]
pub struct ProjectionConsumer {
    pool: PgPool,
    store: ReservationStore,
    group: String,
    stats: Arc<LifecycleStats>,
}

impl ProjectionConsumer {
    pub fn new(
        pool: PgPool,
        store: ReservationStore,
        names: &Names,
        stats: Arc<LifecycleStats>,
    ) -> Self {
        Self {
            group: names.group(TopicKind::OrderEvent),
            pool,
            store,
            stats,
        }
    }

    /// Applies one event. True when the view took it; false when it already
    /// held this version or a newer one.
    pub async fn apply(&self, e: &OrderEvent) -> Result<bool, SettleError> {
        let applied = self
            .store
            .project_order(
                e.activity_id,
                &e.reservation_id,
                &e.order_id,
                e.status,
                e.aggregate_version,
                e.occurred_at.timestamp_millis(),
            )
            .await?;
        if applied {
            self.stats.projected.add(1);
        } else {
            self.stats.projection_stale.add(1);
        }
        Ok(applied)
    }
}

impl SettleEach for ProjectionConsumer {
    type Msg = OrderEvent;

    fn group(&self) -> &str {
        &self.group
    }

    /// Only for quarantine and failure records; the view itself is in Redis.
    fn pool(&self) -> &PgPool {
        &self.pool
    }

    fn parse(m: &IncomingMessage) -> Result<OrderEvent, Malformed> {
        parse_order_event(&m.body)
    }

    async fn settle(&self, e: OrderEvent, m: &IncomingMessage) -> Result<(), SettleError> {
        let outcome = match self.apply(&e).await? {
            true => "PROJECTED",
            false => "STALE",
        };
        trail::settled(
            &self.group,
            m,
            &e.reservation_id,
            Some(&e.order_id),
            outcome,
        );
        Ok(())
    }
}

impl Handler for ProjectionConsumer {
    async fn handle(&self, batch: Vec<IncomingMessage>) -> ConsumeVerdict {
        handle_each(self, batch).await
    }
}
