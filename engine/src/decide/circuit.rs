//! The send circuit (docs/architecture.md §6.7): while the broker does not
//! answer, the publisher and the scanner stop sending, and one probe at a
//! time finds out when it is back. Pure: the caller passes the clock.
//!
//! Why: with the broker down, every send waited out its timeout and every
//! pending reservation was re-sent on its own backoff. A 3,000-reservation
//! sale made 9,288 re-sends and went quiet 60.7 s after the broker came
//! back (issue 15). Behind the circuit, a reservation made during the
//! outage waits in Redis (it is pending there in any case) and is sent
//! once, when the probe succeeds.

use serde::Serialize;

/// When to trip and how long to wait between probes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct CircuitPolicy {
    /// Unreachable outcomes in a row that open the circuit.
    pub trip_after: u32,
    /// The first wait before a probe; doubled after each failed probe.
    pub cooldown_min_ms: u64,
    pub cooldown_max_ms: u64,
    /// A probe that has not reported after this long frees the way for
    /// another (its task died, or it is still waiting on a timeout).
    pub probe_timeout_ms: u64,
}

impl Default for CircuitPolicy {
    fn default() -> Self {
        Self {
            trip_after: 3,
            cooldown_min_ms: 250,
            cooldown_max_ms: 2_000,
            probe_timeout_ms: 5_000,
        }
    }
}

/// The state, with its moves in [`Circuit::permit`] and [`Circuit::record`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "state", rename_all = "SCREAMING_SNAKE_CASE")]
pub enum CircuitState {
    /// Sends go out; `failures` unreachable outcomes in a row so far.
    Closed { failures: u32 },
    /// Nothing goes out until `probe_at_ms`.
    Open {
        since_ms: i64,
        probe_at_ms: i64,
        cooldown_ms: u64,
    },
    /// One probe is out; everyone else holds.
    Probing {
        since_ms: i64,
        probe_started_ms: i64,
        cooldown_ms: u64,
    },
}

/// What a sender may do now.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Permit {
    Send,
    /// Send one batch; its outcome decides whether the circuit closes.
    Probe,
    /// Do not send; the reservations stay pending in Redis.
    Hold,
}

/// How a send ended, as the circuit sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Reach {
    /// The broker answered (stored, or refused with a definite answer).
    Answered,
    /// No answer: connection refused or lost, timeout, no route.
    Unreachable,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Circuit {
    policy: CircuitPolicy,
    state: CircuitState,
}

impl Circuit {
    pub fn new(policy: CircuitPolicy) -> Self {
        Self {
            policy,
            state: CircuitState::Closed { failures: 0 },
        }
    }

    pub fn state(&self) -> CircuitState {
        self.state
    }

    /// Since when the broker has been unreachable, while the circuit is not closed.
    pub fn open_since_ms(&self) -> Option<i64> {
        match self.state {
            CircuitState::Closed { .. } => None,
            CircuitState::Open { since_ms, .. } | CircuitState::Probing { since_ms, .. } => {
                Some(since_ms)
            }
        }
    }

    /// May a sender send at `now_ms`? Taking a [`Permit::Probe`] moves the
    /// circuit to probing, so exactly one sender gets it.
    pub fn permit(&mut self, now_ms: i64) -> Permit {
        match self.state {
            CircuitState::Closed { .. } => Permit::Send,
            CircuitState::Open {
                since_ms,
                probe_at_ms,
                cooldown_ms,
            } if now_ms >= probe_at_ms => {
                self.state = CircuitState::Probing {
                    since_ms,
                    probe_started_ms: now_ms,
                    cooldown_ms,
                };
                Permit::Probe
            }
            CircuitState::Open { .. } => Permit::Hold,
            CircuitState::Probing {
                since_ms,
                probe_started_ms,
                cooldown_ms,
            } if now_ms - probe_started_ms >= self.policy.probe_timeout_ms as i64 => {
                self.state = CircuitState::Probing {
                    since_ms,
                    probe_started_ms: now_ms,
                    cooldown_ms,
                };
                Permit::Probe
            }
            CircuitState::Probing { .. } => Permit::Hold,
        }
    }

    /// Records how a send ended. Returns true when this closed an open circuit.
    pub fn record(&mut self, reach: Reach, now_ms: i64) -> bool {
        let p = self.policy;
        let (next, closed) = match (self.state, reach) {
            (CircuitState::Closed { .. }, Reach::Answered) => {
                (CircuitState::Closed { failures: 0 }, false)
            }
            (_, Reach::Answered) => (CircuitState::Closed { failures: 0 }, true),
            (CircuitState::Closed { failures }, Reach::Unreachable)
                if failures + 1 >= p.trip_after =>
            {
                (
                    CircuitState::Open {
                        since_ms: now_ms,
                        probe_at_ms: now_ms + p.cooldown_min_ms as i64,
                        cooldown_ms: p.cooldown_min_ms,
                    },
                    false,
                )
            }
            (CircuitState::Closed { failures }, Reach::Unreachable) => (
                CircuitState::Closed {
                    failures: failures + 1,
                },
                false,
            ),
            (
                CircuitState::Probing {
                    since_ms,
                    cooldown_ms,
                    ..
                },
                Reach::Unreachable,
            ) => {
                let cooldown = (cooldown_ms * 2).clamp(p.cooldown_min_ms, p.cooldown_max_ms);
                (
                    CircuitState::Open {
                        since_ms,
                        probe_at_ms: now_ms + cooldown as i64,
                        cooldown_ms: cooldown,
                    },
                    false,
                )
            }
            // A send that was already out when the circuit opened: it
            // changes nothing.
            (open @ CircuitState::Open { .. }, Reach::Unreachable) => (open, false),
        };
        self.state = next;
        closed
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tripped(at: i64) -> Circuit {
        let mut c = Circuit::new(CircuitPolicy::default());
        for i in 0..3 {
            assert_eq!(c.permit(at + i), Permit::Send);
            c.record(Reach::Unreachable, at + i);
        }
        c
    }

    #[test]
    fn trips_after_three_unreachable_sends_in_a_row() {
        let mut c = Circuit::new(CircuitPolicy::default());
        c.record(Reach::Unreachable, 0);
        c.record(Reach::Unreachable, 1);
        c.record(Reach::Answered, 2);
        c.record(Reach::Unreachable, 3);
        assert_eq!(
            c.permit(4),
            Permit::Send,
            "an answer in between resets the count"
        );
        let c = tripped(10);
        assert!(matches!(c.state(), CircuitState::Open { since_ms: 12, .. }));
        assert_eq!(c.open_since_ms(), Some(12));
    }

    #[test]
    fn holds_until_the_cooldown_then_lets_exactly_one_probe_out() {
        let mut c = tripped(0);
        assert_eq!(c.permit(100), Permit::Hold);
        assert_eq!(c.permit(252), Permit::Probe);
        assert_eq!(c.permit(253), Permit::Hold, "one probe at a time");
        assert_eq!(c.permit(5_000), Permit::Hold);
        assert_eq!(
            c.permit(5_252),
            Permit::Probe,
            "a probe that never reported is replaced"
        );
    }

    #[test]
    fn a_failed_probe_doubles_the_wait_up_to_the_cap() {
        let mut c = tripped(0);
        let mut now = 0;
        let mut waits = Vec::new();
        for _ in 0..6 {
            while c.permit(now) != Permit::Probe {
                now += 1;
            }
            c.record(Reach::Unreachable, now);
            let CircuitState::Open {
                probe_at_ms,
                since_ms,
                ..
            } = c.state()
            else {
                panic!("a failed probe reopens");
            };
            assert_eq!(since_ms, 2, "the outage began when it tripped");
            waits.push(probe_at_ms - now);
        }
        assert_eq!(waits, vec![500, 1_000, 2_000, 2_000, 2_000, 2_000]);
    }

    #[test]
    fn an_answered_probe_closes_and_says_so() {
        let mut c = tripped(0);
        assert_eq!(c.permit(300), Permit::Probe);
        assert!(c.record(Reach::Answered, 310));
        assert_eq!(c.state(), CircuitState::Closed { failures: 0 });
        assert_eq!(c.permit(311), Permit::Send);
        assert!(!c.record(Reach::Answered, 312), "already closed");
    }

    #[test]
    fn late_failures_of_sends_already_out_do_not_extend_the_wait() {
        let mut c = tripped(0);
        let before = c.state();
        c.record(Reach::Unreachable, 100);
        assert_eq!(c.state(), before);
    }
}
