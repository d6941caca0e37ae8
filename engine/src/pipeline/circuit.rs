//! The send circuit the publisher and the scanner share (docs/architecture.md
//! §6.7): the decision is [`crate::decide::circuit`]; this holds it behind a
//! lock, reads the clock, counts, and logs the moves on-call cares about.

use crate::decide::circuit::{Circuit, CircuitPolicy, CircuitState, Permit, Reach};
use crate::domain::clock::now_ms;
use crate::domain::stats::{CircuitView, Counter};
use crate::mq::{SendOutcome, UnknownCause};
use std::sync::Mutex;

pub struct SendCircuit {
    circuit: Mutex<Circuit>,
    /// Times it opened.
    opened: Counter,
    /// Messages not sent because it was open (they stay pending in Redis).
    held: Counter,
    /// Batches sent as probes.
    probes: Counter,
    /// Bumped when the broker came back after an outage, or a stalled
    /// consumer asked; the daemon restarts its consumers on each
    /// (docs/architecture.md §6.7).
    reconnects: tokio::sync::watch::Sender<u64>,
}

/// How the circuit reads a send's outcome: any answer from the broker
/// means it is reachable, even a refusal.
pub fn reach(outcome: &SendOutcome) -> Reach {
    match outcome {
        SendOutcome::Confirmed(_) | SendOutcome::DefiniteFailure { .. } => Reach::Answered,
        SendOutcome::Unknown { cause, .. } => match cause {
            UnknownCause::Timeout
            | UnknownCause::ConnectionLost
            | UnknownCause::NotSentTransient
            | UnknownCause::NoRoute => Reach::Unreachable,
            UnknownCause::NotDurable | UnknownCause::Unrecognized => Reach::Answered,
        },
    }
}

impl SendCircuit {
    pub fn new(policy: CircuitPolicy) -> Self {
        Self {
            circuit: Mutex::new(Circuit::new(policy)),
            opened: Counter::default(),
            held: Counter::default(),
            probes: Counter::default(),
            reconnects: tokio::sync::watch::Sender::new(0),
        }
    }

    /// Asks for the same consumer restart a closing circuit does: the
    /// governor's stalled-consumer watch calls it (`decide::stall`).
    pub fn restart_consumers(&self) {
        self.reconnects.send_modify(|n| *n += 1);
    }

    /// Changes each time the circuit closes after an outage.
    pub fn reconnects(&self) -> tokio::sync::watch::Receiver<u64> {
        self.reconnects.subscribe()
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Circuit> {
        self.circuit.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// May `n` messages be sent now? A hold is counted.
    pub fn permit(&self, n: usize) -> Permit {
        let p = self.lock().permit(now_ms());
        match p {
            Permit::Hold => self.held.add(n as u64),
            Permit::Probe => self.probes.add(1),
            Permit::Send => {}
        }
        p
    }

    /// Records a send's outcome, and says so in the log when the circuit
    /// opens or closes.
    pub fn record(&self, outcome: &SendOutcome) {
        let reach = reach(outcome);
        let now = now_ms();
        let mut c = self.lock();
        let was_closed = matches!(c.state(), CircuitState::Closed { .. });
        let since = c.open_since_ms();
        let closed = c.record(reach, now);
        let opened = was_closed && !matches!(c.state(), CircuitState::Closed { .. });
        drop(c);
        if opened {
            self.opened.add(1);
            tracing::error!(
                "the broker does not answer; sends held behind the circuit (the reservations stay pending in Redis)"
            );
        }
        if closed {
            self.reconnects.send_modify(|n| *n += 1);
            tracing::warn!(
                outage_ms = since.map(|s| now - s),
                "the broker answers again; the circuit is closed and the scanner sends what was held"
            );
        }
    }

    pub fn view(&self) -> CircuitView {
        let c = *self.lock();
        CircuitView {
            state: match c.state() {
                CircuitState::Closed { .. } => "CLOSED",
                CircuitState::Open { .. } => "OPEN",
                CircuitState::Probing { .. } => "PROBING",
            }
            .to_owned(),
            open_for_s: c
                .open_since_ms()
                .map(|s| (now_ms() - s).max(0) as f64 / 1000.0),
            opened: self.opened.get(),
            held: self.held.get(),
            probes: self.probes.get(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::mq::{DefiniteCause, SendReceipt};

    #[test]
    fn only_silence_counts_against_the_broker() {
        let unknown = |cause| SendOutcome::Unknown {
            cause,
            detail: String::new(),
        };
        assert_eq!(reach(&unknown(UnknownCause::Timeout)), Reach::Unreachable);
        assert_eq!(reach(&unknown(UnknownCause::NoRoute)), Reach::Unreachable);
        assert_eq!(reach(&unknown(UnknownCause::NotDurable)), Reach::Answered);
        let refused = SendOutcome::DefiniteFailure {
            cause: DefiniteCause::MessageIllegal,
            detail: String::new(),
        };
        assert_eq!(reach(&refused), Reach::Answered);
        let stored = SendOutcome::Confirmed(SendReceipt {
            broker_msg_id: "x".into(),
            offset_msg_id: None,
            queue_id: None,
            queue_offset: 0,
        });
        assert_eq!(reach(&stored), Reach::Answered);
    }

    #[test]
    fn holds_are_counted_and_shown() {
        let c = SendCircuit::new(CircuitPolicy {
            cooldown_min_ms: 60_000,
            ..CircuitPolicy::default()
        });
        let down = SendOutcome::Unknown {
            cause: UnknownCause::ConnectionLost,
            detail: String::new(),
        };
        for _ in 0..3 {
            assert_eq!(c.permit(4), Permit::Send);
            c.record(&down);
        }
        assert_eq!(c.permit(16), Permit::Hold);
        let v = c.view();
        assert_eq!((v.state.as_str(), v.opened, v.held), ("OPEN", 1, 16));
        assert!(v.open_for_s.is_some());
    }
}
