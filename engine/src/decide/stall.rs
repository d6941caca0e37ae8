//! A stalled order consumer (docs/architecture.md §6.7): messages wait on
//! the broker, none is in the handler's hands, and the committed offsets
//! have not moved for a while. That is not PostgreSQL being slow (its
//! messages would be in flight): it is pulls that never came back, as
//! rocketmq-rust 1.0.0 leaves them for 30 s on a connection the broker
//! closed. The daemon then restarts its consumers, as it does when its
//! own send circuit closes; this catches an engine that did not send
//! during the outage. Pure: the caller passes the clock.

/// Stalled this long before a restart.
pub const STALL_MS: i64 = 5_000;
/// No second restart sooner than this after one.
pub const COOLDOWN_MS: i64 = 30_000;

/// One governor tick's view of the order group.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConsumerTick {
    pub lag_messages: i64,
    pub consumer_offsets: i64,
    pub inflight: i64,
    pub now_ms: i64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct StallWatch {
    offsets: Option<i64>,
    since_ms: Option<i64>,
    quiet_until_ms: i64,
}

impl StallWatch {
    /// True when the consumers should be restarted now.
    pub fn observe(&mut self, t: ConsumerTick) -> bool {
        let moved = self.offsets != Some(t.consumer_offsets);
        self.offsets = Some(t.consumer_offsets);
        if moved || t.lag_messages <= 0 || t.inflight > 0 {
            self.since_ms = None;
            return false;
        }
        let since = *self.since_ms.get_or_insert(t.now_ms);
        if t.now_ms - since >= STALL_MS && t.now_ms >= self.quiet_until_ms {
            self.since_ms = None;
            self.quiet_until_ms = t.now_ms + COOLDOWN_MS;
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tick(lag: i64, offsets: i64, inflight: i64, now_ms: i64) -> ConsumerTick {
        ConsumerTick {
            lag_messages: lag,
            consumer_offsets: offsets,
            inflight,
            now_ms,
        }
    }

    /// Feeds one tick a second from `from` to `to` seconds; the restarts.
    fn run(
        w: &mut StallWatch,
        lag: i64,
        offsets: impl Fn(i64) -> i64,
        inflight: i64,
        secs: std::ops::Range<i64>,
    ) -> Vec<i64> {
        secs.filter(|s| w.observe(tick(lag, offsets(*s), inflight, s * 1_000)))
            .collect()
    }

    #[test]
    fn waiting_messages_nobody_holds_and_offsets_still_restart_after_five_seconds() {
        let mut w = StallWatch::default();
        // The first tick is the baseline; the stall counts from the second.
        assert_eq!(run(&mut w, 500, |_| 100, 0, 0..10), vec![6]);
    }

    #[test]
    fn a_busy_or_progressing_or_idle_consumer_is_left_alone() {
        let mut w = StallWatch::default();
        assert!(
            run(&mut w, 500, |_| 100, 16, 0..20).is_empty(),
            "in flight: PostgreSQL is slow"
        );
        assert!(
            run(&mut w, 500, |s| 100 + s, 0, 20..40).is_empty(),
            "offsets move"
        );
        assert!(run(&mut w, 0, |_| 7, 0, 40..60).is_empty(), "nothing waits");
    }

    #[test]
    fn one_restart_per_cooldown() {
        let mut w = StallWatch::default();
        assert_eq!(run(&mut w, 500, |_| 100, 0, 0..70), vec![6, 36, 66]);
    }
}
