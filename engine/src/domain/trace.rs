//! One W3C trace per reservation (docs/architecture.md §11.5): the trace id
//! a reservation keeps from ingress to its order, cancel, compensation or
//! replay, and the `traceparent` header it may arrive with.

use crate::domain::ids::ReservationId;
use serde::{Deserialize, Serialize};

/// A W3C trace id: 32 lowercase hex digits, never all zero.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct TraceId(String);

impl TraceId {
    /// The trace of a reservation that arrived without a `traceparent`:
    /// its id's 128 ULID bits, so the trace can be recomputed from the id
    /// alone (a restored reservation, an old hash) and is never zero (a
    /// ULID carries its creation time).
    pub fn of_reservation(id: &ReservationId) -> Self {
        let bits = id
            .to_string()
            .rsplit('_')
            .next()
            .and_then(|u| ulid::Ulid::from_string(u).ok())
            .map_or(0, u128::from);
        // An id that is not a ULID cannot be made here (ids are parsed);
        // should one come, it still gets a valid trace, not a zero one.
        let bits = if bits == 0 {
            rand::random::<u128>() | 1
        } else {
            bits
        };
        TraceId(format!("{bits:032x}"))
    }

    /// A trace id as stored or sent: 32 hex digits, not all zero.
    pub fn parse(s: &str) -> Option<Self> {
        let ok = s.len() == 32
            && s.bytes().all(|b| b.is_ascii_hexdigit())
            && s.bytes().any(|b| b != b'0');
        ok.then(|| TraceId(s.to_ascii_lowercase()))
    }

    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for TraceId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The trace id of a `traceparent` header, when the header is valid by
/// W3C Trace Context level 1: `version-traceid-parentid-flags`, lowercase
/// hex, version `ff` forbidden, neither id all zero. An invalid header is
/// ignored (the spec says to restart the trace), never a refusal.
pub fn parse_traceparent(header: &str) -> Option<TraceId> {
    let header = header.trim();
    let mut parts = header.split('-');
    let (version, trace, parent, flags) =
        (parts.next()?, parts.next()?, parts.next()?, parts.next()?);
    let hex = |s: &str, n: usize| {
        s.len() == n
            && s.bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    };
    let valid = hex(version, 2)
        && version != "ff"
        // Version 00 has exactly four fields; a later version may add more.
        && (version != "00" || parts.next().is_none())
        && hex(trace, 32)
        && hex(parent, 16)
        && parent.bytes().any(|b| b != b'0')
        && hex(flags, 2);
    valid.then(|| TraceId::parse(trace)).flatten()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_reservation_without_a_header_traces_by_its_own_id() {
        let id = ReservationId::generate();
        let t = TraceId::of_reservation(&id);
        assert_eq!(t, TraceId::of_reservation(&id), "recomputable");
        assert!(TraceId::parse(t.as_str()).is_some(), "{t}");
        assert_ne!(t, TraceId::of_reservation(&ReservationId::generate()));
    }

    #[test]
    fn traceparent_headers_by_the_w3c_rules() {
        let good = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";
        assert_eq!(
            parse_traceparent(good).map(|t| t.to_string()),
            Some("4bf92f3577b34da6a3ce929d0e0e4736".to_owned())
        );
        // A later version may carry more fields.
        assert!(
            parse_traceparent(&format!("01-{}-00f067aa0ba902b7-01-xyz", "a".repeat(32))).is_some()
        );
        for bad in [
            "",
            "garbage",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4BF92F3577B34DA6A3CE929D0E0E4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e473-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01-extra",
            "0-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert_eq!(parse_traceparent(bad), None, "{bad:?}");
        }
    }
}
