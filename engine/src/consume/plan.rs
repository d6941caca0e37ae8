//! The per-message decisions of the order transaction between its round
//! trips, as pure functions over plain data (DESIGN.md §7): which new
//! messages are duplicates or rejections before any stock is touched, and
//! which candidates get the units PostgreSQL granted.

use super::RejectReason;
use crate::ids::{ActivityId, SkuId, UserId};
use crate::status::ReservationOutcome;
use std::collections::{BTreeMap, HashSet, VecDeque};

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
/// or holding a candidate earlier in this batch, is a duplicate (DESIGN.md
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

/// Hands the units PostgreSQL granted per (activity, sku) to candidates,
/// oldest first, and re-offers a unit whose candidate lost its user to a
/// concurrent order.
#[derive(Debug, Default)]
pub(crate) struct Allocator {
    skus: BTreeMap<(ActivityId, SkuId), Sku>,
}

#[derive(Debug, Default)]
struct Sku {
    /// Candidates (by caller index) not yet given a unit, oldest first.
    waiting: VecDeque<usize>,
    /// Units taken from inventory and not yet handed out.
    free: i64,
}

impl Allocator {
    /// `candidates` in batch order: (caller index, activity, sku).
    pub fn new(candidates: impl IntoIterator<Item = (usize, ActivityId, SkuId)>) -> Self {
        let mut skus: BTreeMap<(ActivityId, SkuId), Sku> = BTreeMap::new();
        for (i, a, s) in candidates {
            skus.entry((a, s)).or_default().waiting.push_back(i);
        }
        Self { skus }
    }

    /// Units wanted per (activity, sku), in key order (the lock order).
    pub fn wanted(&self) -> Vec<(ActivityId, SkuId, i64)> {
        self.skus
            .iter()
            .map(|(&(a, s), sku)| (a, s, sku.waiting.len() as i64))
            .collect()
    }

    pub fn is_empty(&self) -> bool {
        self.skus.is_empty()
    }

    /// Records the units taken for one (activity, sku).
    pub fn granted(&mut self, activity_id: ActivityId, sku_id: SkuId, units: i64) {
        if let Some(sku) = self.skus.get_mut(&(activity_id, sku_id)) {
            sku.free += units;
        }
    }

    /// Gives a unit back to the pool of its (activity, sku): its candidate
    /// lost the order insert to a concurrent order for the same user.
    pub fn lost(&mut self, activity_id: ActivityId, sku_id: SkuId) {
        self.granted(activity_id, sku_id, 1);
    }

    /// The next candidates to try an order for: as many as there are free
    /// units, oldest first. Empty when nothing more can be placed. Each
    /// round either places every candidate it hands out or loses some for
    /// good, so the rounds end after at most one per candidate.
    pub fn next_round(&mut self) -> Vec<usize> {
        let mut out = Vec::new();
        for sku in self.skus.values_mut() {
            while sku.free > 0 {
                let Some(i) = sku.waiting.pop_front() else {
                    break;
                };
                sku.free -= 1;
                out.push(i);
            }
        }
        out
    }

    /// Candidates left without a unit (no stock) and units to give back.
    pub fn finish(self) -> (Vec<usize>, Vec<(ActivityId, SkuId, i64)>) {
        let mut no_stock = Vec::new();
        let mut giveback = Vec::new();
        for ((a, s), sku) in self.skus {
            no_stock.extend(sku.waiting);
            if sku.free > 0 {
                giveback.push((a, s, sku.free));
            }
        }
        no_stock.sort_unstable();
        (no_stock, giveback)
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
        let mut alloc = Allocator::new([(0, a, s1), (1, a, s2), (2, a, s1), (3, a, s1)]);
        assert_eq!(alloc.wanted(), vec![(a, s1, 3), (a, s2, 1)]);
        alloc.granted(a, s1, 2);
        alloc.granted(a, s2, 0);
        assert_eq!(alloc.next_round(), vec![0, 2]);
        assert_eq!(alloc.next_round(), Vec::<usize>::new());
        let (no_stock, giveback) = alloc.finish();
        assert_eq!(no_stock, vec![1, 3]);
        assert!(giveback.is_empty());
    }

    #[test]
    fn a_lost_unit_is_re_offered_then_given_back() {
        let (a, s) = (ActivityId(1), SkuId(1));
        let mut alloc = Allocator::new([(0, a, s), (1, a, s), (2, a, s)]);
        alloc.granted(a, s, 2);
        assert_eq!(alloc.next_round(), vec![0, 1]);
        // Candidate 1 lost its user to a concurrent order: 2 gets its unit.
        alloc.lost(a, s);
        assert_eq!(alloc.next_round(), vec![2]);
        // 2 lost too, and nobody is left: the unit goes back to inventory.
        alloc.lost(a, s);
        assert_eq!(alloc.next_round(), Vec::<usize>::new());
        let (no_stock, giveback) = alloc.finish();
        assert!(no_stock.is_empty());
        assert_eq!(giveback, vec![(a, s, 1)]);
    }
}
