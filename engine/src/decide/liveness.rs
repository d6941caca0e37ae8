//! Whether a registered engine daemon is live (docs/architecture.md §14.3),
//! and whether each elected singleton has a live holder (§14.4). Pure: the
//! caller passes the heartbeat's age and the lease's validity, measured on
//! the database's clock.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineState {
    Live,
    Dead,
}

/// Why a daemon counts as dead; `None` while it is live.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum DeadBecause {
    /// It shut down cleanly and said so.
    Stopped,
    /// No heartbeat for longer than `dead_after_ms`: killed, hung, or cut
    /// off from PostgreSQL.
    Silent,
}

/// Live while not stopped and heard from within `dead_after_ms`.
pub fn judge(
    stopped: bool,
    heartbeat_age_ms: i64,
    dead_after_ms: i64,
) -> (EngineState, Option<DeadBecause>) {
    if stopped {
        (EngineState::Dead, Some(DeadBecause::Stopped))
    } else if heartbeat_age_ms > dead_after_ms {
        (EngineState::Dead, Some(DeadBecause::Silent))
    } else {
        (EngineState::Live, None)
    }
}

/// Where an elected singleton stands (docs/architecture.md §14.4).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoleState {
    /// A live daemon holds an unexpired lease.
    Held,
    /// The lease is unexpired but its holder is dead: it lapses within the
    /// TTL and a live daemon takes over.
    HolderDead,
    /// Its lease lapsed less than a lease TTL ago (a clean stop gives it
    /// back at once): a live daemon takes it on its next heartbeat.
    HandingOver,
    /// Nobody holds it: never taken, or lapsed with no live daemon asking.
    Unowned,
}

/// A role's lease as [`judge_role`] reads it.
#[derive(Debug, Clone, Copy)]
pub struct LeaseFacts<'a> {
    pub holder: &'a str,
    /// Unexpired on the database's clock.
    pub valid: bool,
    /// Since it expired (negative while valid).
    pub expired_ms: i64,
}

/// `lease` is the role's lease, if it was ever taken; `live` says whether
/// a daemon id is live; `ttl_ms` is `[registry] lease_ttl_ms`.
pub fn judge_role(
    lease: Option<LeaseFacts<'_>>,
    live: impl Fn(&str) -> bool,
    ttl_ms: i64,
) -> RoleState {
    match lease {
        Some(l) if l.valid && live(l.holder) => RoleState::Held,
        Some(l) if l.valid => RoleState::HolderDead,
        Some(l) if l.expired_ms <= ttl_ms => RoleState::HandingOver,
        _ => RoleState::Unowned,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_role_is_held_only_by_a_live_daemon_with_an_unexpired_lease() {
        let live = |id: &str| id == "a";
        let lease = |holder, valid, expired_ms| {
            Some(LeaseFacts {
                holder,
                valid,
                expired_ms,
            })
        };
        assert_eq!(
            judge_role(lease("a", true, -3_000), live, 5_000),
            RoleState::Held
        );
        assert_eq!(
            judge_role(lease("b", true, -3_000), live, 5_000),
            RoleState::HolderDead
        );
        // Given back a moment ago: the next heartbeat takes it.
        assert_eq!(
            judge_role(lease("a", false, 1_000), live, 5_000),
            RoleState::HandingOver
        );
        assert_eq!(
            judge_role(lease("a", false, 60_000), live, 5_000),
            RoleState::Unowned
        );
        assert_eq!(judge_role(None, live, 5_000), RoleState::Unowned);
    }

    #[test]
    fn a_daemon_is_live_until_it_stops_or_falls_silent() {
        assert_eq!(judge(false, 0, 5_000), (EngineState::Live, None));
        assert_eq!(judge(false, 5_000, 5_000), (EngineState::Live, None));
        assert_eq!(
            judge(false, 5_001, 5_000),
            (EngineState::Dead, Some(DeadBecause::Silent))
        );
        assert_eq!(
            judge(true, 0, 5_000),
            (EngineState::Dead, Some(DeadBecause::Stopped))
        );
    }
}
