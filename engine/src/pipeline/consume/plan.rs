//! The per-message decisions of the order transaction between its round
//! trips, as pure functions over plain data (docs/architecture.md §7.1):
//! which messages compete and in what order, which new messages are
//! duplicates or rejections before any stock is touched, which placed
//! orders keep the units PostgreSQL granted, and what each message's
//! outcome is once it commits.

use super::{MessageOutcome, RejectReason};
use crate::domain::ids::{ActivityId, SkuId, UserId};
use crate::domain::status::ReservationOutcome;
use std::collections::{BTreeMap, HashSet};
use std::hash::Hash;

/// Before `BEGIN` (docs/architecture.md §7.1): the input positions of the
/// messages that compete, in batch order. A `message_id` repeated in the
/// batch counts once: its first copy competes and the others are already
/// processed by it. The rest go oldest reservation first, input order
/// breaking ties, because that one wins the stock and the user's single
/// order. Generic only so it can be tested without whole messages.
pub(crate) fn batch_order<T, K, A>(
    msgs: &[T],
    message_id: impl Fn(&T) -> &K,
    reserved_at: impl Fn(&T) -> A,
) -> Vec<usize>
where
    K: Eq + Hash + ?Sized,
    A: Ord,
{
    let mut seen: HashSet<&K> = HashSet::with_capacity(msgs.len());
    let mut batch: Vec<usize> = Vec::with_capacity(msgs.len());
    for (i, m) in msgs.iter().enumerate() {
        if seen.insert(message_id(m)) {
            batch.push(i);
        }
    }
    batch.sort_by_key(|&i| (reserved_at(&msgs[i]), i));
    batch
}

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
    /// The activity's payment window; `None`: the (activity, sku) has no
    /// inventory row (see [`missing_inventory`]).
    pub pay_within_ms: Option<i64>,
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

/// Between round trips 1 and 2 (docs/architecture.md §7.1, §7.3): the
/// (activity, sku) without an inventory row that fails the batch as
/// `MissingInventory`, if a candidate (index into `fresh`) needs one. It is
/// refused here, before the order insert would fail on its foreign key with
/// a plain database error, so the handler can set that SKU's messages aside.
/// Only candidates count: a rejected or duplicate message inserts no order.
/// The first such SKU in key order, as the lock order would meet it.
pub(crate) fn missing_inventory(
    fresh: &[Fresh],
    candidates: &[usize],
) -> Option<(ActivityId, SkuId)> {
    candidates
        .iter()
        .filter(|&&f| fresh[f].pay_within_ms.is_none())
        .map(|&f| (fresh[f].activity_id, fresh[f].sku_id))
        .min()
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

/// After `COMMIT` (docs/architecture.md §7.1 step 5): one outcome per input
/// message, in input order. `batch` is [`batch_order`]'s answer, `fresh_pos`
/// each fresh message's position in it and `decided` each fresh message's
/// outcome. Every other message was already processed: a repeat inside the
/// batch, or one the inbox already held.
pub(crate) fn in_input_order(
    n: usize,
    batch: &[usize],
    fresh_pos: &[usize],
    decided: Vec<MessageOutcome>,
) -> Vec<MessageOutcome> {
    let mut out = vec![MessageOutcome::AlreadyProcessed; n];
    for (f, d) in decided.into_iter().enumerate() {
        out[batch[fresh_pos[f]]] = d;
    }
    out
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
            pay_within_ms: Some(900_000),
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

    #[test]
    fn a_repeated_message_counts_once_and_the_oldest_reservation_goes_first() {
        // (message_id, reserved_at)
        let msgs = [("a", 3), ("b", 1), ("a", 0), ("c", 1), ("b", 1)];
        let batch = batch_order(&msgs, |m| m.0, |m| m.1);
        // The second "a" is older, but only the first copy competes; "b" and
        // "c" tie on age, so input order decides.
        assert_eq!(batch, vec![1, 3, 0]);
        assert!(batch_order(&[] as &[(&str, i32)], |m| m.0, |m| m.1).is_empty());
    }

    #[test]
    fn only_a_candidate_without_inventory_fails_the_batch_first_sku_in_key_order() {
        let no_row = |activity, sku| Fresh {
            activity_id: ActivityId(activity),
            sku_id: SkuId(sku),
            pay_within_ms: None,
            ..fresh(1, OK, false)
        };
        let batch = [
            fresh(1, OK, false),
            no_row(2, 5),
            no_row(1, 9),
            no_row(1, 3),
        ];
        assert_eq!(missing_inventory(&batch, &[]), None);
        assert_eq!(missing_inventory(&batch, &[0]), None);
        assert_eq!(
            missing_inventory(&batch, &[0, 1, 2]),
            Some((ActivityId(1), SkuId(9)))
        );
        // Index 3 is not a candidate here (a rejection inserts no order).
        assert_eq!(
            missing_inventory(&batch, &[1, 2, 3]),
            Some((ActivityId(1), SkuId(3)))
        );
    }

    #[test]
    fn outcomes_go_back_to_input_order_and_the_rest_were_already_processed() {
        use MessageOutcome::{AlreadyProcessed, DuplicateReservation, Rejected};
        // Input 0..5; input 3 repeats input 0; batch order is [2, 0, 4, 1];
        // of those, positions 0 and 2 (inputs 2 and 4) were new to the inbox.
        let got = in_input_order(
            5,
            &[2, 0, 4, 1],
            &[0, 2],
            vec![Rejected(RejectReason::NoStock), DuplicateReservation],
        );
        assert_eq!(
            got,
            vec![
                AlreadyProcessed,
                AlreadyProcessed,
                Rejected(RejectReason::NoStock),
                AlreadyProcessed,
                DuplicateReservation,
            ]
        );
        assert_eq!(
            in_input_order(2, &[0, 1], &[], vec![]),
            vec![AlreadyProcessed; 2]
        );
    }
}
