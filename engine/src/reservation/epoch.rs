//! The epoch of an activity's Redis state, and its restore from PostgreSQL
//! (docs/architecture.md §4.5).
//!
//! Redis is not the source of truth: a restart without persistence, or a
//! failover to a replica that missed writes, loses keys. Every seed and
//! every restore writes an epoch beside the stock; a reservation checks it
//! first, and the engine's watcher compares it with PostgreSQL's
//! `redis_epochs`. The restore writes back what PostgreSQL knows: each
//! SKU's available stock, the users holding a valid order, and the
//! reservation hash of every unpaid order, so that its cancel can still
//! give its unit back exactly once.

use super::store::{connection_broke, read_twice};
use super::{MqStatus, ReservationError, ReservationStore, physical_ttl_ms};
use crate::domain::ids::{ActivityId, MessageId, OrderId, RequestId, ReservationId, SkuId, UserId};
use redis::{AsyncCommands, Script};
use std::sync::LazyLock;

static RESTORE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("restore.lua")));

/// An unpaid order whose reservation hash the restore writes back, so the
/// compensation of its cancel finds something to release.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LiveOrder {
    pub reservation_id: ReservationId,
    pub message_id: MessageId,
    pub request_id: RequestId,
    pub order_id: OrderId,
    pub sku_id: SkuId,
    pub user_id: UserId,
    pub reserved_at_ms: i64,
    pub valid_until_ms: i64,
}

/// What PostgreSQL says the activity's Redis state must be.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoredState {
    pub epoch: i64,
    /// Each SKU's available stock.
    pub stock: Vec<(SkuId, i64)>,
    /// Users holding a valid (not canceled) order.
    pub buyers: Vec<UserId>,
    pub live: Vec<LiveOrder>,
}

impl ReservationStore {
    /// The activity's Redis epoch, `None` when the key is gone.
    pub async fn epoch(&self, activity: ActivityId) -> Result<Option<i64>, ReservationError> {
        let key = self.keys(activity).epoch();
        Ok(read_twice!(self, c => c.get(&key).await)?)
    }

    /// [`Self::epoch`] of several activities in one round trip, in order.
    pub async fn epochs(
        &self,
        activities: &[ActivityId],
    ) -> Result<Vec<Option<i64>>, ReservationError> {
        if activities.is_empty() {
            return Ok(Vec::new());
        }
        // One MGET: the epochs live in as many slots as there are
        // activities, and the cluster client splits an MGET by slot and
        // puts the answers back in order, where a pipeline must stay in one.
        let keys: Vec<String> = activities.iter().map(|a| self.keys(*a).epoch()).collect();
        Ok(read_twice!(self, c => redis::cmd("MGET").arg(&keys).query_async(&mut c).await)?)
    }

    /// Writes `state` back. The reservation hashes and request keys first
    /// (harmless alone: nothing points at them), then one script sets the
    /// buyers, the stock and, last, the epoch that reopens the activity.
    pub async fn restore(
        &self,
        activity: ActivityId,
        state: &RestoredState,
        now_ms: i64,
    ) -> Result<(), ReservationError> {
        let keys = self.keys(activity);
        let mut conn = self.conn();
        for chunk in state.live.chunks(500) {
            let mut pipe = redis::pipe();
            for o in chunk {
                let ttl = physical_ttl_ms(now_ms, o.valid_until_ms);
                let rsv = keys.rsv(&o.reservation_id);
                // MQ_SENT and out of the pending set: the order exists, so
                // nothing is left to send; only a release may move it now.
                pipe.hset_multiple(
                    &rsv,
                    &[
                        ("message_id", o.message_id.to_string()),
                        ("request_id", o.request_id.to_string()),
                        ("order_id", o.order_id.to_string()),
                        ("sku_id", o.sku_id.0.to_string()),
                        ("user_id", o.user_id.0.to_string()),
                        ("mq_status", MqStatus::MqSent.as_str().to_owned()),
                        ("send_attempt", "0".to_owned()),
                        ("next_retry_at", "0".to_owned()),
                        ("lease_owner", String::new()),
                        ("lease_until", "0".to_owned()),
                        ("created_at", o.reserved_at_ms.to_string()),
                        ("valid_until", o.valid_until_ms.to_string()),
                        ("broker_message_id", String::new()),
                        ("last_error", "restored from PostgreSQL".to_owned()),
                    ],
                )
                .ignore()
                .pexpire(&rsv, ttl)
                .ignore()
                .cmd("SET")
                .arg(keys.req(&o.request_id))
                .arg(o.reservation_id.as_str())
                .arg("PX")
                .arg(ttl)
                .ignore();
            }
            let () = pipe.query_async(&mut conn).await?;
        }
        let mut script = RESTORE.key(keys.buyers());
        script.key(keys.epoch());
        for (sku, _) in &state.stock {
            script.key(keys.stock(*sku));
        }
        script.arg(state.epoch);
        for (_, stock) in &state.stock {
            script.arg(*stock);
        }
        for user in &state.buyers {
            script.arg(user.0);
        }
        let _: i64 = script.invoke_async(&mut conn).await?;
        // The scanner finds activities through this set; it was lost too.
        let _: i64 = conn.sadd(self.activities_key(), activity.0).await?;
        Ok(())
    }
}
