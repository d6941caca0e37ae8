//! Whether a write to one activity's shard waits for its replicas
//! (docs/architecture.md §4.6). Pure: the caller passes the clock.
//!
//! `WAIT` blocks the whole connection it is sent on, and the store's
//! connection to a node is multiplexed: a `WAIT` that times out because the
//! shard's replica is down holds every command queued behind it. So once a
//! shard is seen short of replicas, its writes stop waiting, and one write
//! a second probes whether the replica is back:
//!
//! ```text
//! Healthy ──short ack──▶ Degraded{until} ──until passed, one write──▶ Probing
//!    ▲                        ▲                                         │
//!    └───────full ack─────────┼──────────────── full ack ◀──────────────┤
//!                             └──────── short ack or error ◀────────────┘
//! ```

/// How long a shard short of replicas goes without waiting before the
/// next probe.
pub const RECHECK_MS: i64 = 1_000;

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum AckState {
    /// Every write waits for the replicas.
    #[default]
    Healthy,
    /// The last wait came back short: writes go on unwaited until then.
    Degraded { until_ms: i64 },
    /// One write is finding out whether the replicas are back; the others
    /// go on unwaited meanwhile.
    Probing,
}

/// What one write does about its replicas.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Plan {
    Wait,
    /// Also the probe: its outcome moves the state ([`AckState::settle`]).
    Probe,
    Skip,
}

/// How a wait ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Outcome {
    /// This many replicas acknowledged the write.
    Acked(u32),
    /// No answer: the connection broke, or the master died.
    Failed,
}

impl AckState {
    /// The plan for a write starting at `now_ms`, and the state after it.
    pub fn plan(self, now_ms: i64) -> (Plan, AckState) {
        match self {
            AckState::Healthy => (Plan::Wait, self),
            AckState::Degraded { until_ms } if now_ms < until_ms => (Plan::Skip, self),
            AckState::Degraded { .. } => (Plan::Probe, AckState::Probing),
            AckState::Probing => (Plan::Skip, self),
        }
    }

    /// The state after a wait of `plan` ended with `outcome`. A failed
    /// plain wait says nothing of the replicas (the master may be the one
    /// that died), so it leaves the state; a failed probe must not leave
    /// the shard probing for ever, so the next write probes again.
    pub fn settle(self, plan: Plan, outcome: Outcome, wanted: u32, now_ms: i64) -> AckState {
        match (plan, outcome) {
            (Plan::Skip, _) => self,
            (_, Outcome::Acked(n)) if n >= wanted => AckState::Healthy,
            (_, Outcome::Acked(_)) => AckState::Degraded {
                until_ms: now_ms.saturating_add(RECHECK_MS),
            },
            (Plan::Probe, Outcome::Failed) => AckState::Degraded { until_ms: now_ms },
            (Plan::Wait, Outcome::Failed) => self,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_healthy_shard_waits_on_every_write() {
        let (plan, next) = AckState::Healthy.plan(0);
        assert_eq!((plan, next), (Plan::Wait, AckState::Healthy));
        assert_eq!(
            next.settle(plan, Outcome::Acked(1), 1, 5),
            AckState::Healthy
        );
    }

    #[test]
    fn a_short_ack_stops_the_waits_until_one_probe_a_second() {
        let s = AckState::Healthy.settle(Plan::Wait, Outcome::Acked(0), 1, 10);
        assert_eq!(s, AckState::Degraded { until_ms: 1_010 });
        assert_eq!(s.plan(500), (Plan::Skip, s));
        let (plan, probing) = s.plan(1_010);
        assert_eq!((plan, probing), (Plan::Probe, AckState::Probing));
        // Only one probe at a time.
        assert_eq!(probing.plan(1_011), (Plan::Skip, AckState::Probing));
        // Still short: another second unwaited.
        assert_eq!(
            probing.settle(Plan::Probe, Outcome::Acked(0), 1, 1_100),
            AckState::Degraded { until_ms: 2_100 }
        );
        // The replica is back.
        assert_eq!(
            probing.settle(Plan::Probe, Outcome::Acked(1), 1, 1_100),
            AckState::Healthy
        );
    }

    #[test]
    fn a_failed_probe_lets_the_next_write_probe_and_a_failed_wait_changes_nothing() {
        assert_eq!(
            AckState::Probing.settle(Plan::Probe, Outcome::Failed, 1, 7),
            AckState::Degraded { until_ms: 7 }
        );
        assert_eq!(
            AckState::Healthy.settle(Plan::Wait, Outcome::Failed, 1, 7),
            AckState::Healthy
        );
        // A write that skipped learns nothing.
        assert_eq!(
            AckState::Probing.settle(Plan::Skip, Outcome::Acked(1), 1, 7),
            AckState::Probing
        );
    }
}
