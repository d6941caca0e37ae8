//! The verdict of one drill run: pure over its figures and its targets,
//! so the rules are tested without servers.

use serde::Serialize;

/// What a drill run measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Figures {
    /// Reservations the crowd saw accepted (distinct ids).
    pub accepted: u64,
    /// Requests that got no answer even after the client's retries.
    pub unanswered: u64,
    /// Reservations decided in PostgreSQL.
    pub decided: i64,
    /// From the fault healing (or the injection, when nothing heals) to
    /// quiet; `None` when the sale never went quiet.
    pub recovery_s: Option<f64>,
    /// ORDER_CREATE messages the broker stored.
    pub stored_sends: i64,
    /// Sends the engines attempted (every outcome), when all their
    /// counters survived the drill.
    pub send_attempts: Option<i64>,
    /// Reservations the fault touched (made while it lasted, or in flight).
    pub affected: i64,
    /// Sends per affected reservation: the attempts (the stored sends when
    /// an engine died with its counters) beyond one per unaffected
    /// reservation. `None` when no reservation was affected.
    pub sends_per_affected: Option<f64>,
    /// Stored duplicates (stored sends beyond one per decided reservation),
    /// each absorbed by the consumer's inbox.
    pub duplicates_absorbed: i64,
    /// Messages in the order group's DLQ (distinct message ids: a message
    /// dead-lettered twice counts once).
    pub dlq: i64,
    /// Of those, the ones whose effect was applied all the same (their
    /// inbox row succeeded): dead beside a poison message on its last
    /// redelivery. Noise for the DLQ tickets, not a lost order.
    pub dlq_applied: i64,
    /// Reconcile's failed invariants, by name.
    pub violated: Vec<String>,
    /// What the drill observed of its own injection, for the report.
    pub notes: Vec<String>,
    /// The drill's own expectations that did not hold (an expired
    /// reservation that became an order, a second order after a replay).
    pub unmet: Vec<String>,
}

/// What a drill promises.
#[derive(Debug, Clone, Copy, Serialize)]
pub struct Targets {
    /// Seconds from the fault healing to quiet.
    pub recovery_s: f64,
    /// Sends per affected reservation, when the drill bounds them.
    pub sends_per_affected: Option<f64>,
    /// Exactly this many dead messages.
    pub dlq: i64,
}

#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(
    tag = "verdict",
    content = "reasons",
    rename_all = "SCREAMING_SNAKE_CASE"
)]
pub enum Verdict {
    Pass,
    Fail(Vec<String>),
}

impl Verdict {
    pub fn passed(&self) -> bool {
        matches!(self, Verdict::Pass)
    }
}

/// Every invariant must hold and every target be met; each miss is a reason.
pub fn judge(f: &Figures, t: &Targets) -> Verdict {
    let mut reasons: Vec<String> = f
        .violated
        .iter()
        .map(|i| format!("invariant violated: {i}"))
        .collect();
    match f.recovery_s {
        None => reasons.push("the sale never went quiet".to_owned()),
        Some(s) if s > t.recovery_s => reasons.push(format!(
            "quiet {s:.1} s after the fault healed; the target is {:.0} s",
            t.recovery_s
        )),
        Some(_) => {}
    }
    if let (Some(limit), Some(got)) = (t.sends_per_affected, f.sends_per_affected)
        && got > limit
    {
        reasons.push(format!(
            "{got:.2} sends per affected reservation; the target is {limit}"
        ));
    }
    let dead = f.dlq - f.dlq_applied;
    if dead != t.dlq {
        reasons.push(format!(
            "{dead} message(s) in the DLQ without their effect; expected {}",
            t.dlq
        ));
    }
    reasons.extend(f.unmet.iter().cloned());
    if f.unanswered > 0 && f.recovery_s.is_none() {
        reasons.push(format!("{} request(s) never answered", f.unanswered));
    }
    if reasons.is_empty() {
        Verdict::Pass
    } else {
        Verdict::Fail(reasons)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy() -> Figures {
        Figures {
            accepted: 100,
            decided: 100,
            recovery_s: Some(3.0),
            stored_sends: 102,
            affected: 20,
            sends_per_affected: Some(1.1),
            duplicates_absorbed: 2,
            ..Figures::default()
        }
    }

    const TARGETS: Targets = Targets {
        recovery_s: 15.0,
        sends_per_affected: Some(1.2),
        dlq: 0,
    };

    #[test]
    fn a_clean_run_passes() {
        assert_eq!(judge(&healthy(), &TARGETS), Verdict::Pass);
    }

    #[test]
    fn each_miss_is_its_own_reason() {
        let f = Figures {
            recovery_s: Some(16.0),
            sends_per_affected: Some(1.5),
            dlq: 3,
            violated: vec!["valid orders <= initial PostgreSQL stock".into()],
            ..healthy()
        };
        let Verdict::Fail(reasons) = judge(&f, &TARGETS) else {
            panic!("must fail")
        };
        assert_eq!(reasons.len(), 4, "{reasons:?}");
        assert!(reasons[0].contains("oversell") || reasons[0].contains("stock"));
    }

    #[test]
    fn never_quiet_fails_even_with_every_invariant_holding() {
        let f = Figures {
            recovery_s: None,
            ..healthy()
        };
        assert!(!judge(&f, &TARGETS).passed());
    }

    #[test]
    fn a_poison_drill_expects_its_one_dead_message() {
        let t = Targets { dlq: 1, ..TARGETS };
        assert!(!judge(&healthy(), &t).passed(), "0 dead when 1 is expected");
        let f = Figures {
            dlq: 1,
            ..healthy()
        };
        assert!(judge(&f, &t).passed());
    }

    #[test]
    fn dead_messages_whose_effect_was_applied_are_not_counted_as_lost() {
        let t = Targets { dlq: 1, ..TARGETS };
        let f = Figures {
            dlq: 3,
            dlq_applied: 2,
            ..healthy()
        };
        assert!(judge(&f, &t).passed());
        let lost = Figures {
            dlq: 3,
            dlq_applied: 1,
            ..healthy()
        };
        assert!(
            !judge(&lost, &t).passed(),
            "an innocent died without its order"
        );
    }

    #[test]
    fn a_drills_own_expectation_fails_it() {
        let f = Figures {
            unmet: vec!["no reservation expired in the backlog".into()],
            ..healthy()
        };
        assert_eq!(
            judge(&f, &TARGETS),
            Verdict::Fail(vec!["no reservation expired in the backlog".into()])
        );
    }

    #[test]
    fn sends_are_judged_only_where_bounded() {
        let t = Targets {
            sends_per_affected: None,
            ..TARGETS
        };
        let f = Figures {
            sends_per_affected: Some(9.0),
            ..healthy()
        };
        assert!(judge(&f, &t).passed());
    }
}
