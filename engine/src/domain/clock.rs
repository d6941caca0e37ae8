//! Wall-clock milliseconds, the unit Redis scores, message bodies and the
//! observers share.

use chrono::{DateTime, TimeZone, Utc};

/// Milliseconds since the epoch, now.
pub fn now_ms() -> i64 {
    Utc::now().timestamp_millis()
}

/// Milliseconds since the epoch as a timestamp (now, if out of range).
pub fn at_ms(ms: i64) -> DateTime<Utc> {
    Utc.timestamp_millis_opt(ms)
        .single()
        .unwrap_or_else(Utc::now)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn at_ms_round_trips_and_falls_back_to_now_out_of_range() {
        assert_eq!(
            at_ms(1_700_000_000_123).timestamp_millis(),
            1_700_000_000_123
        );
        let before = now_ms();
        assert!(at_ms(i64::MAX).timestamp_millis() >= before);
    }
}
