//! The per-message decisions of the order transaction between its round
//! trips, as pure functions over plain data (docs/architecture.md §7): which new
//! messages are duplicates or rejections before any stock is touched, and
//! which placed orders keep the units PostgreSQL granted.

use super::RejectReason;
use crate::domain::ids::{ActivityId, SkuId, UserId};
use crate::domain::status::ReservationOutcome;
use std::collections::{BTreeMap, HashSet};

/// What the inbox-and-claim statement said about one message new to the
/// inbox, in batch order (oldest reservation first).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Fresh {
    pub activity_id: ActivityId,
    pub sku_id: SkuId,
    pub user_id: UserId,
    /// `None`: another message already claimed the reservation.
    pub claimed: Option<ReservationOutcome>,
    /// The user held a valid order in this activity when the statement ran.
    pub user_has_order: bool,
}

/// A message's fate before stock is allocated.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Screened {
    /// The reservation's effect already happened (or is happening in this
    /// batch) under another `message_id`: nothing more, no compensation.
    DuplicateReservation,
    Rejected(RejectReason),
    /// Competes for stock.
    Candidate,
}

/// Screens fresh messages in order. A user already holding a valid order,
/// or holding a candidate earlier in this batch, is a duplicate (docs/architecture.md
/// §12, one valid order per user): only candidates hold the user's place,
/// so an expired or duplicate reservation does not block a later one.
pub(crate) fn screen(fresh: &[Fresh]) -> Vec<Screened> {
    let mut users: HashSet<(ActivityId, UserId)> = HashSet::new();
    fresh
        .iter()
        .map(|f| match f.claimed {
            None => Screened::DuplicateReservation,
            Some(ReservationOutcome::RejectedExpired) => Screened::Rejected(RejectReason::Expired),
            Some(_) if f.user_has_order => Screened::Rejected(RejectReason::DuplicateUser),
            Some(_) if !users.insert((f.activity_id, f.user_id)) => {
                Screened::Rejected(RejectReason::DuplicateUser)
            }
            Some(_) => Screened::Candidate,
        })
        .collect()
}

/// Shares the units PostgreSQL granted per (activity, sku) among the orders
/// already placed, oldest reservation first. The orders go in before the
/// stock is taken (see `sql::TAKE_STOCK`), so the units wanted are exactly
/// the orders placed, and a candidate that lost its user to a concurrent
/// order never asked for one: there is nothing to re-offer or give back.
#[derive(Debug, Default)]
pub(crate) struct Allocation {
    /// Placed orders (by caller index) per (activity, sku), oldest first.
    skus: BTreeMap<(ActivityId, SkuId), Vec<usize>>,
}

impl Allocation {
    /// `placed` in batch order: (caller index, activity, sku).
    pub fn new(placed: impl IntoIterator<Item = (usize, ActivityId, SkuId)>) -> Self {
        let mut skus: BTreeMap<(ActivityId, SkuId), Vec<usize>> = BTreeMap::new();
        for (i, a, s) in placed {
            skus.entry((a, s)).or_default().push(i);
        }
        Self { skus }
    }

    /// Units wanted per (activity, sku), in key order (the lock order).
    pub fn wanted(&self) -> Vec<(ActivityId, SkuId, i64)> {
        self.skus
            .iter()
            .map(|(&(a, s), placed)| (a, s, placed.len() as i64))
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.skus.is_empty()
    }

    /// The placed orders left without a unit, in caller order: per (activity,
    /// sku), all but the oldest `granted(activity, sku)`.
    pub fn unserved(&self, granted: impl Fn(ActivityId, SkuId) -> i64) -> Vec<usize> {
        let mut out: Vec<usize> = self
            .skus
            .iter()
            .flat_map(|(&(a, s), placed)| {
                let keep = usize::try_from(granted(a, s)).unwrap_or(0);
                placed.iter().skip(keep).copied()
            })
            .collect();
        out.sort_unstable();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn fresh(user: i64, claimed: Option<ReservationOutcome>, has: bool) -> Fresh {
        Fresh {
            activity_id: ActivityId(1),
            sku_id: SkuId(1),
            user_id: UserId(user),
            claimed,
            user_has_order: has,
        }
    }

    const OK: Option<ReservationOutcome> = Some(ReservationOutcome::OrderCreated);
    const EXPIRED: Option<ReservationOutcome> = Some(ReservationOutcome::RejectedExpired);

    #[test]
    fn screening_order_is_claim_then_expiry_then_user() {
        let got = screen(&[
            fresh(1, None, false),
            fresh(2, EXPIRED, true),
            fresh(3, OK, true),
            fresh(4, OK, false),
            fresh(4, OK, false),
            fresh(1, OK, false),
        ]);
        assert_eq!(
            got,
            vec![
                Screened::DuplicateReservation,
                Screened::Rejected(RejectReason::Expired),
                Screened::Rejected(RejectReason::DuplicateUser),
                Screened::Candidate,
                Screened::Rejected(RejectReason::DuplicateUser),
                // User 1's first message was a duplicate reservation: it holds no place.
                Screened::Candidate,
            ]
        );
    }

    #[test]
    fn an_expired_reservation_does_not_hold_the_users_place() {
        let got = screen(&[fresh(5, EXPIRED, false), fresh(5, OK, false)]);
        assert_eq!(
            got,
            vec![
                Screened::Rejected(RejectReason::Expired),
                Screened::Candidate
            ]
        );
    }

    #[test]
    fn the_same_user_in_two_activities_is_two_candidates() {
        let mut other = fresh(9, OK, false);
        other.activity_id = ActivityId(2);
        assert_eq!(
            screen(&[fresh(9, OK, false), other]),
            vec![Screened::Candidate, Screened::Candidate]
        );
    }

    #[test]
    fn partial_grants_go_to_the_oldest_and_the_rest_have_no_stock() {
        let (a, s1, s2) = (ActivityId(1), SkuId(1), SkuId(2));
        let alloc = Allocation::new([(0, a, s1), (1, a, s2), (2, a, s1), (3, a, s1)]);
        assert_eq!(alloc.wanted(), vec![(a, s1, 3), (a, s2, 1)]);
        let granted = |_, s| if s == s1 { 2 } else { 0 };
        assert_eq!(alloc.unserved(granted), vec![1, 3]);
    }

    #[test]
    fn a_full_grant_leaves_nobody_unserved() {
        let (a, s) = (ActivityId(1), SkuId(1));
        let alloc = Allocation::new([(4, a, s), (7, a, s)]);
        assert_eq!(alloc.wanted(), vec![(a, s, 2)]);
        assert!(alloc.unserved(|_, _| 2).is_empty());
        // No grant at all (a sold-out row): every placed order is undone.
        assert_eq!(alloc.unserved(|_, _| 0), vec![4, 7]);
    }

    #[test]
    fn nothing_placed_wants_nothing() {
        let alloc = Allocation::new([]);
        assert!(alloc.is_empty());
        assert!(alloc.wanted().is_empty());
        assert!(alloc.unserved(|_, _| 0).is_empty());
    }
}
