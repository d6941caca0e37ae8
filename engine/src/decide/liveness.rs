//! Whether a registered engine daemon is live (docs/architecture.md §14.3).
//! Pure: the caller passes the heartbeat's age, measured on the database's
//! clock.

use serde::Serialize;

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

#[cfg(test)]
mod tests {
    use super::*;

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
