//! A DLQ entry's lifecycle as one state machine (docs/architecture.md §9.2),
//! and the ticket that follows its entries. Pure: the SQL that moves a row
//! is written after these tables, and their tests are the contract.
//!
//! ```text
//! DEAD ──replay sent──▶ REPLAYING ──effect seen──▶ VERIFIED
//!  ▲  ▲                    │  │
//!  │  └──send failed───────┘  └──not seen in time──▶ REPLAYED ──effect seen──▶ VERIFIED
//!  └────────────died again (the replayed copy too)──────┘
//! DEAD | REPLAYED ──discard (fenced)──▶ DISCARDED
//! ```
//!
//! An entry whose business effect exists becomes VERIFIED whoever produced
//! it: the replay, the broker's own redelivery of the replayed copy, or the
//! scanner's re-send of the same `message_id`.

use crate::domain::status::{DlqEntryStatus, TicketStatus};
use serde::Serialize;

/// What happens to an entry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EntryMove {
    /// A replay is about to send the original message again.
    ReplaySent,
    /// The broker refused the replayed copy for certain.
    SendFailed,
    /// Sent and confirmed, but the effect was not seen within the wait.
    NotSeenInTime,
    /// The message's business effect exists in PostgreSQL.
    EffectSeen,
    /// The message, or its replayed copy, went to the DLQ again.
    DiedAgain,
    /// On-call ended it without its effect (`dlq discard`).
    Discard,
}

/// Why a move is refused, in on-call's words.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum EntryRefusal {
    #[error("a replay of it is in flight")]
    InFlight,
    #[error("it is already verified: its effect exists")]
    AlreadyVerified,
    #[error("it was discarded")]
    Discarded,
    #[error("it is not being replayed")]
    NotReplaying,
    #[error(
        "its last replay was sent (or may have been) and is not verified yet; --include-replayed sends it again"
    )]
    Replayed,
    #[error("its last replay's send is unknown: a copy may still be in the broker")]
    CopyMayExist,
}

/// What the table needs besides the status.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct MoveFacts {
    /// Send again an entry whose earlier replay went out unverified.
    pub include_replayed: bool,
    /// Another replay of it is running now (an open audit row).
    pub in_flight: bool,
}

/// The next status, or why not (pure). A move that already took effect is
/// allowed where repeating it is harmless (a second discard, a second
/// verification).
pub fn next(
    from: DlqEntryStatus,
    m: EntryMove,
    f: MoveFacts,
) -> Result<DlqEntryStatus, EntryRefusal> {
    use DlqEntryStatus as S;
    use EntryMove as M;
    match (from, m) {
        (S::Discarded, M::Discard) => Ok(S::Discarded),
        (S::Discarded, _) => Err(EntryRefusal::Discarded),
        (_, M::EffectSeen) => Ok(S::Verified),
        (_, M::DiedAgain) => Ok(S::Dead),
        (S::Verified, M::ReplaySent | M::Discard) => Err(EntryRefusal::AlreadyVerified),
        (_, M::ReplaySent | M::Discard) if f.in_flight => Err(EntryRefusal::InFlight),
        (S::Dead, M::ReplaySent) => Ok(S::Replaying),
        (S::Replayed | S::Replaying, M::ReplaySent) if f.include_replayed => Ok(S::Replaying),
        (S::Replayed | S::Replaying, M::ReplaySent) => Err(EntryRefusal::Replayed),
        (S::Replaying, M::SendFailed) => Ok(S::Dead),
        (S::Replaying, M::NotSeenInTime) => Ok(S::Replayed),
        (_, M::SendFailed | M::NotSeenInTime) => Err(EntryRefusal::NotReplaying),
        (S::Dead | S::Replayed, M::Discard) => Ok(S::Discarded),
        (S::Replaying, M::Discard) => Err(EntryRefusal::CopyMayExist),
    }
}

/// Where a ticket goes when its entries move (pure): VERIFIED once every
/// entry is VERIFIED or DISCARDED, and back to OPEN (its owner kept) when
/// an entry of a VERIFIED ticket is dead again or a new one arrives. A
/// CLOSED ticket stays closed: the mirror opens a new one for its class.
pub fn ticket_after(from: TicketStatus, entries: &[DlqEntryStatus]) -> TicketStatus {
    use DlqEntryStatus as E;
    let settled = |e: &E| matches!(e, E::Verified | E::Discarded);
    match from {
        TicketStatus::Closed => from,
        _ if !entries.is_empty() && entries.iter().all(settled) => TicketStatus::Verified,
        TicketStatus::Verified => TicketStatus::Open,
        _ => from,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use DlqEntryStatus as S;
    use EntryMove as M;

    const F0: MoveFacts = MoveFacts {
        include_replayed: false,
        in_flight: false,
    };
    const F1: MoveFacts = MoveFacts {
        include_replayed: true,
        in_flight: false,
    };
    const BUSY: MoveFacts = MoveFacts {
        include_replayed: true,
        in_flight: true,
    };

    #[test]
    fn a_replay_runs_dead_replaying_then_verified_or_replayed() {
        assert_eq!(next(S::Dead, M::ReplaySent, F0), Ok(S::Replaying));
        assert_eq!(next(S::Replaying, M::EffectSeen, F0), Ok(S::Verified));
        assert_eq!(next(S::Replaying, M::NotSeenInTime, F0), Ok(S::Replayed));
        assert_eq!(next(S::Replayed, M::EffectSeen, F0), Ok(S::Verified));
        assert_eq!(next(S::Replaying, M::SendFailed, F0), Ok(S::Dead));
    }

    #[test]
    fn a_replayed_copy_that_dies_again_is_dead_again() {
        assert_eq!(next(S::Replayed, M::DiedAgain, F0), Ok(S::Dead));
        assert_eq!(next(S::Replaying, M::DiedAgain, F0), Ok(S::Dead));
        assert_eq!(next(S::Dead, M::DiedAgain, F0), Ok(S::Dead));
        assert_eq!(
            next(S::Discarded, M::DiedAgain, F0),
            Err(EntryRefusal::Discarded)
        );
    }

    #[test]
    fn whoever_produced_the_effect_verifies_it() {
        assert_eq!(next(S::Dead, M::EffectSeen, F0), Ok(S::Verified));
        assert_eq!(next(S::Verified, M::EffectSeen, F0), Ok(S::Verified));
    }

    #[test]
    fn replays_are_refused_with_their_reason() {
        assert_eq!(
            next(S::Dead, M::ReplaySent, BUSY),
            Err(EntryRefusal::InFlight)
        );
        // Not in flight: an unknown send may be sent again, on purpose.
        assert_eq!(next(S::Replaying, M::ReplaySent, F1), Ok(S::Replaying));
        assert_eq!(
            next(S::Replaying, M::ReplaySent, F0),
            Err(EntryRefusal::Replayed)
        );
        assert_eq!(
            next(S::Verified, M::ReplaySent, F1),
            Err(EntryRefusal::AlreadyVerified)
        );
        assert_eq!(
            next(S::Replayed, M::ReplaySent, F0),
            Err(EntryRefusal::Replayed)
        );
        assert_eq!(next(S::Replayed, M::ReplaySent, F1), Ok(S::Replaying));
        assert_eq!(
            next(S::Dead, M::NotSeenInTime, F0),
            Err(EntryRefusal::NotReplaying)
        );
    }

    #[test]
    fn a_discard_is_fenced_by_a_replay_in_flight_and_an_effect() {
        assert_eq!(next(S::Dead, M::Discard, F0), Ok(S::Discarded));
        assert_eq!(next(S::Replayed, M::Discard, F0), Ok(S::Discarded));
        assert_eq!(next(S::Discarded, M::Discard, F0), Ok(S::Discarded));
        assert_eq!(next(S::Dead, M::Discard, BUSY), Err(EntryRefusal::InFlight));
        assert_eq!(
            next(S::Replaying, M::Discard, F0),
            Err(EntryRefusal::CopyMayExist)
        );
        assert_eq!(
            next(S::Verified, M::Discard, F0),
            Err(EntryRefusal::AlreadyVerified)
        );
    }

    #[test]
    fn every_state_and_move_has_an_answer() {
        for from in S::ALL {
            for m in [
                M::ReplaySent,
                M::SendFailed,
                M::NotSeenInTime,
                M::EffectSeen,
                M::DiedAgain,
                M::Discard,
            ] {
                // No panic, and a refusal always says why.
                for f in [F0, F1, BUSY] {
                    if let Err(e) = next(*from, m, f) {
                        assert!(!e.to_string().is_empty());
                    }
                }
            }
        }
    }

    #[test]
    fn a_ticket_follows_its_entries() {
        use TicketStatus as T;
        assert_eq!(
            ticket_after(T::Open, &[S::Verified, S::Discarded]),
            T::Verified
        );
        assert_eq!(ticket_after(T::Fixed, &[S::Verified, S::Dead]), T::Fixed);
        assert_eq!(ticket_after(T::Verified, &[S::Verified, S::Dead]), T::Open);
        assert_eq!(ticket_after(T::Closed, &[S::Verified]), T::Closed);
        assert_eq!(ticket_after(T::Acked, &[]), T::Acked);
        assert_eq!(ticket_after(T::Replaying, &[S::Verified]), T::Verified);
    }
}
