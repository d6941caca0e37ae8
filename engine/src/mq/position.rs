//! Where this process's consumers have got to in each queue, fresher than
//! the broker's committed offsets (docs/architecture.md §10.4).
//!
//! Why: the client tells the broker its consumed offsets once a second at
//! best, so lag measured from the broker alone reads up to a second old,
//! and a queue that just moved (a rolling restart, §14) reads one to two
//! seconds worse than it is. The daemon reports these positions in
//! `/v1/stats`; the observer takes, per queue, the further of the two.
//!
//! A position never runs ahead of the truth: it is the first offset not
//! yet answered, counted from the first batch seen since the queue was
//! assigned, and a batch counts once its listener call returned (ACK, or a
//! retry the client sends back to `%RETRY%`, whose own lag is measured
//! apart). A queue that is not contiguous (a tag filter) simply stops
//! advancing, and the broker's offset takes over.

use crate::domain::stats::QueuePosition;
use std::collections::{BTreeMap, HashMap, HashSet};
use std::sync::Mutex;

/// One queue of one group, as the client names it.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueKey {
    pub group: String,
    pub topic: String,
    pub broker: String,
    pub queue_id: i32,
}

/// The answered offsets of one queue: a floor (the lowest batch start
/// seen) and the answered ranges above it, merged as they touch.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Lane {
    floor: Option<i64>,
    /// start → end (exclusive), disjoint and not touching.
    done: BTreeMap<i64, i64>,
}

impl Lane {
    /// A batch `[start, end)` was handed to the listener. A batch that
    /// starts below every earlier one (two consume threads raced at the
    /// start) lowers the floor, so the position waits for it.
    pub fn started(&mut self, start: i64) {
        self.floor = Some(self.floor.map_or(start, |f| f.min(start)));
    }

    /// The listener answered the batch `[start, end)`.
    pub fn answered(&mut self, start: i64, end: i64) {
        if end <= start {
            return;
        }
        self.started(start);
        let (mut s, mut e) = (start, end);
        // Absorb every range that overlaps or touches [s, e).
        let touching: Vec<(i64, i64)> = self
            .done
            .range(..=e)
            .filter(|(_, end)| **end >= s)
            .map(|(a, b)| (*a, *b))
            .collect();
        for (a, b) in touching {
            self.done.remove(&a);
            s = s.min(a);
            e = e.max(b);
        }
        self.done.insert(s, e);
        // Ranges below the floor's run can never matter again.
        let keep = self.position();
        if let Some(k) = keep {
            self.done.retain(|a, b| *b >= k || *a >= k);
        }
    }

    /// The first offset not yet answered, if any batch was seen.
    pub fn position(&self) -> Option<i64> {
        let floor = self.floor?;
        Some(match self.done.range(..=floor).next_back() {
            Some((_, end)) if *end >= floor => *end,
            _ => floor,
        })
    }
}

/// Queues by (broker, queue id).
pub type Queues = HashSet<(String, i32)>;

/// Every queue of every consumer of this process.
#[derive(Debug, Default)]
pub struct Positions {
    lanes: Mutex<HashMap<QueueKey, Lane>>,
    /// The queues each (group, topic) was last assigned.
    assigned: Mutex<HashMap<(String, String), Queues>>,
}

impl Positions {
    pub fn new() -> Self {
        Self::default()
    }

    fn with_lane(&self, key: QueueKey, f: impl FnOnce(&mut Lane)) {
        let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        f(lanes.entry(key).or_default());
    }

    pub fn started(&self, key: QueueKey, start: i64) {
        self.with_lane(key, |l| l.started(start));
    }

    pub fn answered(&self, key: QueueKey, start: i64, end: i64) {
        self.with_lane(key, |l| l.answered(start, end));
    }

    /// A rebalance changed what (group, topic) pulls: a queue given up is
    /// forgotten, and so is one newly given, whose old lane (from an
    /// earlier ownership) is behind where the new one starts.
    pub fn reassigned(&self, group: &str, topic: &str, now: Queues) {
        let mut assigned = self.assigned.lock().unwrap_or_else(|p| p.into_inner());
        let before = assigned
            .insert((group.to_owned(), topic.to_owned()), now.clone())
            .unwrap_or_default();
        let mut lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        lanes.retain(|k, _| {
            if k.group != group || k.topic != topic {
                return true;
            }
            let q = (k.broker.clone(), k.queue_id);
            now.contains(&q) && before.contains(&q)
        });
    }

    /// The queues the client's last rebalance gave (group, topic) in this
    /// process, as (broker, queue id); `None` until it told one.
    pub fn assigned(&self, group: &str, topic: &str) -> Option<Queues> {
        let assigned = self.assigned.lock().unwrap_or_else(|p| p.into_inner());
        assigned.get(&(group.to_owned(), topic.to_owned())).cloned()
    }

    /// Every queue's position, for `/v1/stats`.
    pub fn view(&self) -> Vec<QueuePosition> {
        let lanes = self.lanes.lock().unwrap_or_else(|p| p.into_inner());
        let mut out: Vec<QueuePosition> = lanes
            .iter()
            .filter_map(|(k, lane)| {
                Some(QueuePosition {
                    group: k.group.clone(),
                    topic: k.topic.clone(),
                    broker: k.broker.clone(),
                    queue_id: k.queue_id,
                    offset: lane.position()?,
                })
            })
            .collect();
        out.sort_by(|a, b| {
            (&a.group, &a.topic, &a.broker, a.queue_id)
                .cmp(&(&b.group, &b.topic, &b.broker, b.queue_id))
        });
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lane_advances_only_over_answered_batches() {
        let mut l = Lane::default();
        assert_eq!(l.position(), None);
        l.started(100);
        assert_eq!(l.position(), Some(100));
        l.started(116);
        // The later batch answers first: the earlier one still holds it.
        l.answered(116, 132);
        assert_eq!(l.position(), Some(100));
        l.answered(100, 116);
        assert_eq!(l.position(), Some(132));
        l.answered(132, 140);
        assert_eq!(l.position(), Some(140));
    }

    #[test]
    fn a_batch_that_starts_below_the_first_one_lowers_the_floor() {
        let mut l = Lane::default();
        l.started(16);
        l.answered(16, 32);
        assert_eq!(l.position(), Some(32));
        // The earlier batch reaches its thread late.
        l.started(0);
        assert_eq!(l.position(), Some(0));
        l.answered(0, 16);
        assert_eq!(l.position(), Some(32));
    }

    #[test]
    fn answers_beyond_a_gap_wait_for_it() {
        let mut l = Lane::default();
        l.answered(0, 10);
        l.answered(20, 30);
        assert_eq!(l.position(), Some(10));
        l.answered(10, 20);
        assert_eq!(l.position(), Some(30));
        assert_eq!(l.done.len(), 1, "merged ranges: {:?}", l.done);
    }

    #[test]
    fn redelivered_batches_do_not_move_a_lane_back() {
        let mut l = Lane::default();
        l.answered(0, 10);
        l.answered(0, 10);
        l.answered(5, 8);
        assert_eq!(l.position(), Some(10));
    }

    proptest::proptest! {
        /// Batches of one queue start in order but may be answered in any
        /// order: the position never passes an offset not yet answered,
        /// and reaches the end once all are.
        #[test]
        fn a_position_never_runs_ahead_of_the_answers(
            sizes in proptest::collection::vec(1i64..8, 1..20),
            order in proptest::collection::vec(proptest::prelude::any::<proptest::sample::Index>(), 20),
        ) {
            let mut batches = Vec::new();
            let mut at = 40;
            for n in &sizes {
                batches.push((at, at + n));
                at += n;
            }
            let mut lane = Lane::default();
            for (s, _) in &batches {
                lane.started(*s);
            }
            let mut open = batches.clone();
            let mut k = 0;
            while !open.is_empty() {
                let (s, e) = open.remove(order[k % order.len()].index(open.len()));
                k += 1;
                lane.answered(s, e);
                let first_open = open.iter().map(|(s, _)| *s).min().unwrap_or(at);
                proptest::prop_assert_eq!(lane.position(), Some(first_open));
            }
        }
    }

    fn key(q: i32) -> QueueKey {
        QueueKey {
            group: "g".into(),
            topic: "t".into(),
            broker: "b".into(),
            queue_id: q,
        }
    }

    #[test]
    fn a_rebalance_forgets_queues_given_up_and_newly_given() {
        let p = Positions::new();
        p.reassigned("g", "t", [("b".to_owned(), 0), ("b".to_owned(), 1)].into());
        p.answered(key(0), 0, 10);
        p.answered(key(1), 0, 10);
        p.answered(key(2), 0, 10);
        // Queue 1 goes away, 2 comes (back): its lane is from before.
        p.reassigned("g", "t", [("b".to_owned(), 0), ("b".to_owned(), 2)].into());
        let ids: Vec<i32> = p.view().iter().map(|q| q.queue_id).collect();
        assert_eq!(ids, vec![0]);
        p.answered(key(2), 50, 60);
        assert_eq!(p.view()[1].offset, 60);
    }
}
