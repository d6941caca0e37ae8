//! The verdict of `seckillctl trace` (docs/architecture.md §11.6): from what
//! each store says of one reservation, whether its story is consistent,
//! still in flight, or broken, and why. Pure.

use crate::domain::status::{CompensationStatus, DlqEntryStatus, OrderStatus, ReservationOutcome};
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum StoryVerdict {
    /// Every store agrees, and nothing more is owed to it by the pipeline.
    Consistent,
    /// On its way: a later step (a send, a transaction, a release) is due.
    InFlight,
    /// The stores disagree in a way no pending step repairs.
    Broken,
}

/// What Redis still holds of the reservation.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RedisHold {
    /// Reserved and not yet known consumed (MQ_PENDING, SENDING, MQ_SENT).
    Reserved,
    /// The send failed for certain.
    SendFailed,
    /// Its stock and buyer slot went back.
    Released,
}

/// One reservation's facts, as read (PostgreSQL first, Redis after).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Facts {
    pub redis: Option<RedisHold>,
    pub outcome: Option<ReservationOutcome>,
    pub order: Option<OrderStatus>,
    pub compensation: Option<CompensationStatus>,
    /// The newest DLQ entry of its messages, if one died.
    pub dlq: Option<DlqEntryStatus>,
}

/// The verdict and its reason, for people.
pub fn judge(f: &Facts) -> (StoryVerdict, String) {
    use StoryVerdict::*;
    let released = |what: &str| match f.compensation {
        Some(CompensationStatus::Released) | Some(CompensationStatus::SettledByRestore) => {
            (Consistent, format!("{what}; its stock went back"))
        }
        Some(CompensationStatus::Pending) => (
            InFlight,
            format!("{what}; the release of its stock is pending"),
        ),
        Some(CompensationStatus::Orphaned) => (
            Broken,
            format!("{what}; its compensation is ORPHANED (runbooks/dlq.md)"),
        ),
        None => (
            Broken,
            format!("{what}, but no compensation task gives its stock back"),
        ),
    };
    match (f.outcome, f.order) {
        (None, Some(_)) => (
            Broken,
            "an order exists without PostgreSQL's reservation row".to_owned(),
        ),
        (None, None) => match (f.dlq, f.redis) {
            (Some(DlqEntryStatus::Dead | DlqEntryStatus::Replayed), _) => (
                Broken,
                "its message is dead in the DLQ with no effect: replay or discard it (runbooks/dlq.md)"
                    .to_owned(),
            ),
            (Some(DlqEntryStatus::Replaying), _) => {
                (InFlight, "a replay of its dead message is under way".to_owned())
            }
            (_, Some(RedisHold::Reserved)) => (
                InFlight,
                "reserved in Redis; no order transaction has decided it yet".to_owned(),
            ),
            (_, Some(RedisHold::SendFailed)) => released("its send failed for certain"),
            (_, Some(RedisHold::Released)) => released("released in Redis before any order"),
            (_, None) => match f.compensation {
                Some(_) => released("no order transaction decided it"),
                None => (
                    Broken,
                    "PostgreSQL never decided it and Redis no longer holds it: lost (runbooks/redis_state_lost.md)"
                        .to_owned(),
                ),
            },
        },
        (Some(ReservationOutcome::OrderCreated), None) => (
            Broken,
            "decided ORDER_CREATED, but there is no order".to_owned(),
        ),
        (Some(ReservationOutcome::OrderCreated), Some(OrderStatus::Canceled)) => {
            released("the order was canceled")
        }
        (Some(ReservationOutcome::OrderCreated), Some(status)) => match f.compensation {
            Some(c) => (
                Broken,
                format!(
                    "the order is {} yet a compensation ({}) gives its stock back: sold twice",
                    status.as_str(),
                    c.as_str()
                ),
            ),
            None if status == OrderStatus::Paid => (Consistent, "the order is PAID".to_owned()),
            None => (
                Consistent,
                format!(
                    "the order is {}, awaiting payment; its delayed cancel is armed",
                    status.as_str()
                ),
            ),
        },
        (Some(rejected), Some(status)) => (
            Broken,
            format!(
                "decided {} yet an order exists ({})",
                rejected.as_str(),
                status.as_str()
            ),
        ),
        (Some(rejected), None) => released(&format!("decided {}", rejected.as_str())),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn facts(
        outcome: Option<ReservationOutcome>,
        order: Option<OrderStatus>,
        compensation: Option<CompensationStatus>,
    ) -> Facts {
        Facts {
            outcome,
            order,
            compensation,
            ..Facts::default()
        }
    }

    #[test]
    fn an_order_or_a_released_rejection_is_consistent() {
        use CompensationStatus as C;
        use OrderStatus as O;
        use ReservationOutcome as R;
        let v = |f: Facts| judge(&f).0;
        assert_eq!(
            v(facts(Some(R::OrderCreated), Some(O::Paid), None)),
            StoryVerdict::Consistent
        );
        assert_eq!(
            v(facts(Some(R::OrderCreated), Some(O::Created), None)),
            StoryVerdict::Consistent
        );
        assert_eq!(
            v(facts(
                Some(R::OrderCreated),
                Some(O::Canceled),
                Some(C::Released)
            )),
            StoryVerdict::Consistent
        );
        assert_eq!(
            v(facts(Some(R::RejectedNoStock), None, Some(C::Released))),
            StoryVerdict::Consistent
        );
        assert_eq!(
            v(facts(Some(R::RejectedNoStock), None, Some(C::Pending))),
            StoryVerdict::InFlight
        );
    }

    #[test]
    fn disagreements_are_broken_with_their_reason() {
        use CompensationStatus as C;
        use OrderStatus as O;
        use ReservationOutcome as R;
        let (v, why) = judge(&facts(
            Some(R::OrderCreated),
            Some(O::Paid),
            Some(C::Released),
        ));
        assert_eq!(v, StoryVerdict::Broken);
        assert!(why.contains("sold twice"), "{why}");
        assert_eq!(
            judge(&facts(Some(R::OrderCreated), None, None)).0,
            StoryVerdict::Broken
        );
        assert_eq!(
            judge(&facts(Some(R::RejectedExpired), None, None)).0,
            StoryVerdict::Broken
        );
        assert_eq!(
            judge(&facts(Some(R::RejectedDuplicate), Some(O::Created), None)).0,
            StoryVerdict::Broken
        );
        assert_eq!(
            judge(&facts(Some(R::OrderCreated), Some(O::Canceled), None)).0,
            StoryVerdict::Broken
        );
        assert_eq!(
            judge(&facts(None, None, None)).0,
            StoryVerdict::Broken,
            "lost"
        );
    }

    #[test]
    fn before_postgresql_decides() {
        let f = |redis, dlq| Facts {
            redis,
            dlq,
            ..Facts::default()
        };
        assert_eq!(
            judge(&f(Some(RedisHold::Reserved), None)).0,
            StoryVerdict::InFlight
        );
        let (v, why) = judge(&f(Some(RedisHold::Reserved), Some(DlqEntryStatus::Dead)));
        assert_eq!(v, StoryVerdict::Broken);
        assert!(why.contains("DLQ"), "{why}");
        assert_eq!(
            judge(&f(None, Some(DlqEntryStatus::Replaying))).0,
            StoryVerdict::InFlight
        );
        let failed = Facts {
            redis: Some(RedisHold::SendFailed),
            compensation: Some(CompensationStatus::Released),
            ..Facts::default()
        };
        assert_eq!(judge(&failed).0, StoryVerdict::Consistent);
    }
}
