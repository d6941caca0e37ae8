//! The drills: what each injects, where its playbook is, what it promises,
//! and which ones CI runs. Pure data (docs/architecture.md §13.5).

use super::verdict::Targets;
use serde::Serialize;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub enum DrillName {
    EngineKill,
    ConsumerKill,
    BrokerRestart,
    NetworkCut,
    Poison,
    SkuLock,
    EngineKillOneOfTwo,
    ConsumerRestart,
    BacklogExpiry,
    DlqReplayTwice,
    CancelEarlyLate,
    PgFailover,
    ScaleToSaturation,
    RedisRestart,
    RollingRestart,
    SingletonTakeover,
}

/// One drill's description.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Spec {
    pub name: DrillName,
    /// The injection row of docs/architecture.md §13.5 it covers, if any.
    pub seed_row: Option<u8>,
    pub injection: &'static str,
    pub expected: &'static str,
    pub playbook: &'static str,
    /// In the fast subset `scripts/test.sh` runs.
    pub ci: bool,
    pub targets: Targets,
    /// Engine daemons the drill starts.
    pub engines: usize,
}

impl DrillName {
    pub const ALL: [DrillName; 16] = [
        DrillName::EngineKill,
        DrillName::ConsumerKill,
        DrillName::BrokerRestart,
        DrillName::NetworkCut,
        DrillName::Poison,
        DrillName::SkuLock,
        DrillName::EngineKillOneOfTwo,
        DrillName::ConsumerRestart,
        DrillName::BacklogExpiry,
        DrillName::DlqReplayTwice,
        DrillName::CancelEarlyLate,
        DrillName::PgFailover,
        DrillName::ScaleToSaturation,
        DrillName::RedisRestart,
        DrillName::RollingRestart,
        DrillName::SingletonTakeover,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            DrillName::EngineKill => "engine-kill",
            DrillName::ConsumerKill => "consumer-kill",
            DrillName::BrokerRestart => "broker-restart",
            DrillName::NetworkCut => "network-cut",
            DrillName::Poison => "poison",
            DrillName::SkuLock => "sku-lock",
            DrillName::EngineKillOneOfTwo => "engine-kill-one-of-two",
            DrillName::ConsumerRestart => "consumer-restart",
            DrillName::BacklogExpiry => "backlog-expiry",
            DrillName::DlqReplayTwice => "dlq-replay-twice",
            DrillName::CancelEarlyLate => "cancel-early-late",
            DrillName::PgFailover => "pg-failover",
            DrillName::ScaleToSaturation => "scale-to-saturation",
            DrillName::RedisRestart => "redis-restart",
            DrillName::RollingRestart => "rolling-restart",
            DrillName::SingletonTakeover => "singleton-takeover",
        }
    }

    pub fn spec(self) -> Spec {
        let quiet = |recovery_s: f64| Targets {
            recovery_s,
            sends_per_affected: None,
            dlq: 0,
        };
        let (seed_row, injection, expected, ci, targets, engines) = match self {
            DrillName::EngineKill => (
                Some(1),
                "kill -9 of the engine mid-burst, after Redis reserved and before the send; restart it",
                "the scanner re-sends what was reserved and never sent; every reservation becomes exactly one order",
                true,
                quiet(30.0),
                1,
            ),
            DrillName::ConsumerKill => (
                Some(3),
                "kill -9 of the engine while its consumer drains the backlog (after commit, before ACK); restart it",
                "the broker redelivers the unacknowledged batches; the inbox turns them into no-ops",
                false,
                quiet(30.0),
                1,
            ),
            DrillName::BrokerRestart => (
                Some(5),
                "kill -9 of the broker mid-burst; start it again 5 s later",
                "ingress keeps accepting into Redis; sends fail fast and the scanner re-sends once the broker is back",
                true,
                Targets {
                    recovery_s: 15.0,
                    sends_per_affected: Some(1.2),
                    dlq: 0,
                },
                1,
            ),
            DrillName::NetworkCut => (
                Some(2),
                "the link to the broker loses its replies for 3 s (requests stored, replies lost), then drops for 2 s",
                "sends end unknown; the scanner re-sends with the same message_id; duplicates are absorbed, one order each",
                false,
                Targets {
                    recovery_s: 20.0,
                    sends_per_affected: None,
                    dlq: 0,
                },
                1,
            ),
            DrillName::Poison => (
                None,
                "PostgreSQL refuses one user's order (a trigger raises for that user)",
                "every other order is created at once; that one message retries and goes to the DLQ",
                true,
                Targets {
                    recovery_s: 20.0,
                    sends_per_affected: None,
                    dlq: 1,
                },
                1,
            ),
            DrillName::SkuLock => (
                None,
                "an outside session holds the SKU's inventory row (SELECT ... FOR UPDATE) for 8 s mid-burst",
                "order transactions wait on the lock; `pg` shows the waiters, `health` goes critical; the backlog drains once it is released",
                false,
                quiet(20.0),
                1,
            ),
            DrillName::EngineKillOneOfTwo => (
                None,
                "two engines share the sale; kill -9 of one mid-burst, never restarted",
                "the survivor consumes every queue after the rebalance and its scanner takes over the dead one's pending sends",
                true,
                quiet(45.0),
                2,
            ),
            DrillName::ConsumerRestart => (
                Some(6),
                "two engines drain the backlog; both stop at once (SIGTERM) and start again",
                "the consumers rebalance; batches taken and not acknowledged come again and the inbox absorbs them: one order per reservation",
                false,
                quiet(30.0),
                2,
            ),
            DrillName::BacklogExpiry => (
                Some(7),
                "reservations valid for 6 s; the engine is frozen (SIGSTOP) for 8 s with the backlog unconsumed, then thawed",
                "messages past their reservation's validity become REJECTED_EXPIRED, never orders; each is compensated exactly once",
                false,
                quiet(30.0),
                1,
            ),
            DrillName::DlqReplayTwice => (
                Some(8),
                "a message dies (a trigger refuses one user's order); the trigger is dropped and `seckillctl dlq replay` runs twice",
                "the first replay creates the order under the original message_id; the second changes nothing: one order, and no dead message left without its effect",
                false,
                Targets {
                    recovery_s: 30.0,
                    sends_per_affected: None,
                    dlq: 0,
                },
                1,
            ),
            DrillName::CancelEarlyLate => (
                Some(9),
                "pay window 10 s; 100 cancel messages delivered early, half the orders paid, 100 cancels of paid orders delivered late",
                "an early cancel changes nothing and re-arms; a late one of a paid order changes nothing; unpaid orders cancel by their timer, p99 within 2 s of the deadline",
                false,
                quiet(15.0),
                1,
            ),
            DrillName::PgFailover => (
                Some(4),
                "the drill's own PostgreSQL cluster restarts mid-burst with `pg_ctl -m fast`, then with `-m immediate` (crash recovery)",
                "order transactions fail, roll back and come again; the pool reconnects; one order per reservation, nothing in the DLQ",
                false,
                quiet(30.0),
                1,
            ),
            DrillName::ScaleToSaturation => (
                Some(10),
                "the consumer asks for 16 threads on an 8-connection pool; mid-burst PostgreSQL saturates (the SKU row held 6 s, every order transaction waits)",
                "the governor keeps the consumer inside its PostgreSQL budget and does not raise it while transactions wait; `scale advise` does not say to add consumers",
                false,
                quiet(20.0),
                1,
            ),
            DrillName::RedisRestart => (
                None,
                "the drill's own Redis (no persistence) restarts empty mid-burst",
                "the engine fails closed (503 REDIS_STATE_LOST), `health` goes critical; `activity restore` rebuilds Redis from PostgreSQL and the sale finishes with every invariant holding",
                false,
                quiet(30.0),
                1,
            ),
            DrillName::RollingRestart => (
                None,
                "three engines share a sale; each in turn gets SIGTERM, exits, and starts again while the crowd keeps buying; `health` runs throughout",
                "no order lost, none duplicated; each stop hands its queues and singleton leases over; `health` never goes critical or unreachable",
                true,
                quiet(30.0),
                3,
            ),
            DrillName::SingletonTakeover => (
                None,
                "two engines; three users' orders are refused (a trigger) and die; once the first is mirrored, kill -9 of the engine holding the dlq-mirror lease",
                "the survivor takes the dlq-mirror lease within the lease TTL and mirrors every dead message exactly once; the sale finishes",
                true,
                Targets {
                    recovery_s: 45.0,
                    sends_per_affected: None,
                    dlq: 3,
                },
                2,
            ),
        };
        Spec {
            name: self,
            seed_row,
            injection,
            expected,
            playbook: self.playbook(),
            ci,
            targets,
            engines,
        }
    }

    pub fn playbook(self) -> &'static str {
        match self {
            DrillName::EngineKill => "playbooks/engine-kill.md",
            DrillName::ConsumerKill => "playbooks/consumer-kill.md",
            DrillName::BrokerRestart => "playbooks/broker-restart.md",
            DrillName::NetworkCut => "playbooks/network-cut.md",
            DrillName::Poison => "playbooks/poison.md",
            DrillName::SkuLock => "playbooks/sku-lock.md",
            DrillName::EngineKillOneOfTwo => "playbooks/engine-kill-one-of-two.md",
            DrillName::ConsumerRestart => "playbooks/consumer-restart.md",
            DrillName::BacklogExpiry => "playbooks/backlog-expiry.md",
            DrillName::DlqReplayTwice => "playbooks/dlq-replay-twice.md",
            DrillName::CancelEarlyLate => "playbooks/cancel-early-late.md",
            DrillName::PgFailover => "playbooks/pg-failover.md",
            DrillName::ScaleToSaturation => "playbooks/scale-to-saturation.md",
            DrillName::RedisRestart => "playbooks/redis-restart.md",
            DrillName::RollingRestart => "playbooks/rolling-restart.md",
            DrillName::SingletonTakeover => "playbooks/singleton-takeover.md",
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    #[test]
    fn every_drill_has_its_playbook_with_the_four_sections() {
        let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
        for d in DrillName::ALL {
            let path = root.join(d.playbook());
            let text = std::fs::read_to_string(&path)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            for section in [
                "## Injection",
                "## What on-call sees",
                "## Expected",
                "## Recover",
            ] {
                assert!(text.contains(section), "{} lacks {section}", path.display());
            }
            assert!(
                text.contains(&format!("seckillctl drill run {}", d.as_str())),
                "{} must name its command",
                path.display()
            );
        }
    }

    #[test]
    fn names_match_clap_and_serde() {
        use clap::ValueEnum;
        for d in DrillName::ALL {
            assert_eq!(d.to_possible_value().unwrap().get_name(), d.as_str());
            assert_eq!(serde_json::to_value(d).unwrap(), d.as_str());
        }
        assert_eq!(DrillName::ALL.len(), DrillName::value_variants().len());
    }
}
