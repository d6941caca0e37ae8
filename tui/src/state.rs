//! The TUI's plain data: what is on screen and what the operator is doing.
//! No I/O, no terminal types: [`crate::update`] changes it, [`crate::ui`]
//! draws it.

use seckill_engine::{
    Alert, BacklogRow, DlqEntry, EngineRow, MessageId, PendingRow, PgView, ReplayReport, Story,
    Ticket, TicketId, Verdict,
};
use std::collections::{BTreeMap, VecDeque};
use std::fmt;
use std::time::Duration;

/// A sparkline keeps this much history (docs/architecture.md §13: the last 5 minutes).
pub const HISTORY: Duration = Duration::from_secs(300);

/// Up or down, as the last refresh saw it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Component {
    pub name: String,
    pub up: bool,
    pub error: Option<String>,
}

/// One refresh: everything the main screen shows, from the engine's
/// observe and dlq functions (the same ones the CLI uses).
#[derive(Debug, Clone)]
pub struct Data {
    pub at_ms: i64,
    pub components: Vec<Component>,
    pub backlog: Vec<BacklogRow>,
    pub pending: Vec<PendingRow>,
    pub pg: PgView,
    /// Every engine daemon, live or dead, with the singletons it runs.
    pub engines: Vec<EngineRow>,
    pub alerts: Vec<Alert>,
    /// Tickets not CLOSED.
    pub tickets: Vec<Ticket>,
    /// Why the tickets could not be read (the panel says so rather than
    /// showing "none open").
    pub tickets_error: Option<String>,
}

impl Data {
    pub fn worst_alert(&self) -> Option<&Alert> {
        // The first of the worst: alerts are in docs/architecture.md §11.2 order.
        self.alerts
            .iter()
            .rev()
            .filter(|a| a.state.firing())
            .max_by_key(|a| a.state)
    }
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Focus {
    Backlog,
    Tickets,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ConfirmStage {
    /// Typing the last 6 characters of the message id.
    Suffix,
    /// Saying why, for the audit row.
    Reason,
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Confirm {
    pub group: String,
    pub message_id: MessageId,
    pub stage: ConfirmStage,
}

/// Which effect an answer belongs to.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EffectKind {
    LoadTicket,
    Precheck,
    DryRun,
    Replay,
    Ack,
    Assign,
    Trace,
}

/// Why an effect brought no answer: which effect, and the engine's error
/// as text. The engine's errors hold sqlx and broker errors, which are not
/// Clone, and the screen only ever shows them; the text is shown as it is,
/// after the prefix of the line that names the action.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{detail}")]
pub struct EffectError {
    pub effect: EffectKind,
    pub detail: String,
}

impl EffectError {
    pub fn new(effect: EffectKind, e: impl fmt::Display) -> Self {
        Self {
            effect,
            detail: e.to_string(),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    Normal,
    Help,
    /// Editing the filter (`/`).
    Filter,
    /// Inside a ticket.
    Drill,
    /// Assigning (or, empty, acknowledging) the ticket (`a`).
    Assign,
    /// The explicit confirmation of a real replay.
    Confirm(Confirm),
}

/// The ticket on screen, with its messages.
#[derive(Debug, Clone)]
pub struct Drill {
    pub ticket_id: TicketId,
    pub ticket: Option<Ticket>,
    pub entries: Vec<DlqEntry>,
    pub selected: usize,
    /// Pre-check verdicts of the selected message (read-only).
    pub verdicts: Option<Result<Vec<Verdict>, EffectError>>,
    pub dry_run: Option<ReplayReport>,
    /// The selected message's story (`t`, docs/architecture.md §11.6).
    pub story: Option<Result<Story, EffectError>>,
    pub error: Option<EffectError>,
}

impl Drill {
    pub fn new(ticket_id: TicketId) -> Self {
        Self {
            ticket_id,
            ticket: None,
            entries: Vec::new(),
            selected: 0,
            verdicts: None,
            dry_run: None,
            story: None,
            error: None,
        }
    }

    pub fn entry(&self) -> Option<&DlqEntry> {
        self.entries.get(self.selected)
    }
}

#[derive(Debug, Clone)]
pub struct State {
    pub readonly: bool,
    pub refresh: Duration,
    pub data: Option<Data>,
    /// Why the last refresh produced nothing at all.
    pub refresh_error: Option<String>,
    /// When each component was last seen up (ms since the epoch).
    pub last_seen: BTreeMap<String, i64>,
    /// lag_seconds per group, oldest first, in milliseconds.
    pub lag_history: BTreeMap<String, VecDeque<u64>>,
    pub focus: Focus,
    pub sel_backlog: usize,
    pub sel_ticket: usize,
    pub filter: String,
    /// The text being typed in Filter, Assign or Confirm.
    pub input: String,
    pub mode: Mode,
    pub drill: Option<Drill>,
    /// One line of feedback (the last action's result).
    pub status: Option<String>,
    /// The loop's clock (ms since the epoch), to tell stale data.
    pub now_ms: i64,
}

impl State {
    pub fn new(refresh: Duration, readonly: bool) -> Self {
        Self {
            readonly,
            refresh,
            data: None,
            refresh_error: None,
            last_seen: BTreeMap::new(),
            lag_history: BTreeMap::new(),
            focus: Focus::Backlog,
            sel_backlog: 0,
            sel_ticket: 0,
            filter: String::new(),
            input: String::new(),
            mode: Mode::Normal,
            drill: None,
            status: None,
            now_ms: 0,
        }
    }

    fn matches(&self, text: &str) -> bool {
        self.filter.is_empty() || text.to_lowercase().contains(&self.filter.to_lowercase())
    }

    /// Backlog rows that pass the filter.
    pub fn backlog(&self) -> Vec<&BacklogRow> {
        self.data
            .iter()
            .flat_map(|d| &d.backlog)
            .filter(|r| self.matches(&r.group))
            .collect()
    }

    /// Tickets that pass the filter (id, group, error class or owner).
    pub fn tickets(&self) -> Vec<&Ticket> {
        self.data
            .iter()
            .flat_map(|d| &d.tickets)
            .filter(|t| {
                self.matches(&format!(
                    "{} {} {} {}",
                    t.ticket_id,
                    t.consumer_group,
                    t.error_class,
                    t.owner.as_deref().unwrap_or("")
                ))
            })
            .collect()
    }

    pub fn selected_ticket(&self) -> Option<&Ticket> {
        self.tickets().get(self.sel_ticket).copied()
    }

    /// How old the data on screen is, once it is older than three refreshes:
    /// a stuck source must show, not freeze the numbers silently.
    pub fn stale_ms(&self) -> Option<i64> {
        let at = self.data.as_ref()?.at_ms;
        let age = self.now_ms - at;
        (self.now_ms > 0 && age > 3 * self.refresh.as_millis() as i64).then_some(age)
    }
}
