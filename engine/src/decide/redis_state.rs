//! Whether Redis still holds an activity's state (docs/architecture.md
//! §4.5): PostgreSQL's latest epoch against the one beside the stock.

use serde::{Deserialize, Serialize};

/// How long an ended activity waits past its end plus its validity window
/// before it may retire (docs/architecture.md §16.3): a reservation
/// admitted just before the end is still deciding its order then, and the
/// engines' facts are up to `FACTS_FRESH` (5 s) old. The Redis-state watch
/// leaves an ended activity out from the same moment, so the retirement's
/// deleted epoch never reads as lost state.
pub const RETIRE_GRACE: std::time::Duration = std::time::Duration::from_secs(60);

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum RedisState {
    /// Redis holds the latest epoch (or a newer one, written by a restore
    /// whose PostgreSQL commit has not landed yet).
    Intact,
    /// The epoch key is gone: Redis restarted empty, or evicted or lost it.
    Lost,
    /// Redis holds an older epoch than PostgreSQL: it came back from an
    /// old snapshot or a replica that missed the last seed or restore.
    Stale,
}

impl RedisState {
    pub fn as_str(self) -> &'static str {
        match self {
            RedisState::Intact => "INTACT",
            RedisState::Lost => "LOST",
            RedisState::Stale => "STALE",
        }
    }

    /// Reservations must be refused: admitting against a stock figure that
    /// PostgreSQL did not write could oversell.
    pub fn refuses(self) -> bool {
        self != RedisState::Intact
    }
}

/// Judges one activity (pure).
pub fn judge(pg_epoch: i64, redis_epoch: Option<i64>) -> RedisState {
    match redis_epoch {
        None => RedisState::Lost,
        Some(r) if r < pg_epoch => RedisState::Stale,
        Some(_) => RedisState::Intact,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_older_epoch_refuses() {
        assert_eq!(judge(3, Some(3)), RedisState::Intact);
        assert_eq!(judge(3, Some(4)), RedisState::Intact);
        assert_eq!(judge(3, None), RedisState::Lost);
        assert_eq!(judge(3, Some(2)), RedisState::Stale);
        assert!(judge(1, None).refuses() && judge(2, Some(1)).refuses());
        assert!(!judge(1, Some(1)).refuses());
    }
}
