//! `update(&mut State, Msg) -> Option<Effect>`: every key and every
//! result, with no I/O (STYLE.md, TUI). The loop in [`crate::app`] runs
//! the returned [`Effect`].

use crate::state::{
    Confirm, ConfirmStage, Data, Drill, EffectError, EffectKind, Focus, HISTORY, Mode, State,
};
use seckill_engine::{
    DlqEntry, MessageId, ReplayDecision, ReplayReport, Story, Ticket, TicketId, Verdict,
};

/// A key, already decoded from the terminal's event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Key {
    Char(char),
    Up,
    Down,
    Tab,
    BackTab,
    Enter,
    Esc,
    Backspace,
}

#[derive(Debug)]
pub enum Msg {
    Key(Key),
    Refreshed(Box<Data>),
    RefreshFailed(String),
    TicketLoaded {
        ticket_id: TicketId,
        result: Result<(Option<Ticket>, Vec<DlqEntry>), EffectError>,
    },
    Verdicts {
        message_id: MessageId,
        result: Result<Vec<Verdict>, EffectError>,
    },
    DryRun(Result<ReplayReport, EffectError>),
    Replayed(Result<ReplayReport, EffectError>),
    TicketChanged(Result<Ticket, EffectError>),
    /// The selected message's story (docs/architecture.md §11.6).
    Traced(Result<Story, EffectError>),
    /// The loop's clock, once per refresh interval.
    Tick(i64),
    /// Ctrl-C, SIGTERM.
    Quit,
}

/// What the loop must do: the only way `update` causes I/O.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Effect {
    Quit,
    LoadTicket(TicketId),
    Precheck {
        group: String,
        message_id: MessageId,
    },
    DryRun {
        group: String,
        message_id: MessageId,
    },
    Replay {
        group: String,
        message_id: MessageId,
        reason: String,
    },
    Ack(TicketId),
    Assign {
        ticket_id: TicketId,
        owner: String,
    },
    /// `seckillctl trace` of a message, read-only.
    Trace(MessageId),
}

impl Effect {
    /// Which effect this is, for its error; `None` for Quit, which has no
    /// answer.
    pub fn kind(&self) -> Option<EffectKind> {
        Some(match self {
            Effect::Quit => return None,
            Effect::LoadTicket(_) => EffectKind::LoadTicket,
            Effect::Precheck { .. } => EffectKind::Precheck,
            Effect::DryRun { .. } => EffectKind::DryRun,
            Effect::Replay { .. } => EffectKind::Replay,
            Effect::Ack(_) => EffectKind::Ack,
            Effect::Assign { .. } => EffectKind::Assign,
            Effect::Trace(_) => EffectKind::Trace,
        })
    }
}

/// The last 6 characters the operator must type to replay for real.
pub fn suffix(message_id: &str) -> &str {
    let n = message_id.chars().count();
    let skip = n.saturating_sub(6);
    let start = message_id
        .char_indices()
        .nth(skip)
        .map_or(message_id.len(), |(i, _)| i);
    &message_id[start..]
}

fn step(sel: &mut usize, len: usize, down: bool) {
    if len == 0 {
        *sel = 0;
    } else if down {
        *sel = (*sel + 1).min(len - 1);
    } else {
        *sel = sel.saturating_sub(1);
    }
}

fn clamp(sel: &mut usize, len: usize) {
    *sel = (*sel).min(len.saturating_sub(1));
}

pub fn update(s: &mut State, msg: Msg) -> Option<Effect> {
    match msg {
        Msg::Quit => Some(Effect::Quit),
        Msg::Tick(now_ms) => {
            s.now_ms = now_ms;
            None
        }
        Msg::Key(k) => key(s, k),
        Msg::Refreshed(data) => {
            refreshed(s, *data);
            None
        }
        Msg::RefreshFailed(e) => {
            s.refresh_error = Some(e);
            None
        }
        Msg::TicketLoaded { ticket_id, result } => ticket_loaded(s, &ticket_id, result),
        Msg::Verdicts { message_id, result } => {
            let d = s.drill.as_mut()?;
            // A late answer for another message is not shown against this one.
            if d.entry()
                .is_some_and(|e| e.message_id.message_id() == Some(&message_id))
            {
                d.verdicts = Some(result);
            }
            None
        }
        Msg::Traced(result) => {
            s.status = Some(match &result {
                Ok(story) => format!("story of {}: {:?}", story.anchor, story.verdict),
                Err(e) => format!("trace failed: {e}"),
            });
            if let Some(d) = s.drill.as_mut() {
                d.story = Some(result);
            }
            None
        }
        Msg::DryRun(result) => {
            match result {
                Ok(report) => dry_run_done(s, report),
                Err(e) => s.status = Some(format!("dry run failed: {e}")),
            }
            None
        }
        Msg::Replayed(result) => {
            s.status = Some(match &result {
                Ok(r) => format!(
                    "replay {} of {}: {}, {} {}",
                    r.replay_id_str(),
                    r.message_id,
                    r.decision,
                    r.outcome,
                    r.detail
                ),
                Err(e) => format!("replay failed: {e}"),
            });
            reload(s)
        }
        Msg::TicketChanged(result) => {
            s.status = Some(match result {
                Ok(t) => format!(
                    "ticket {} is {}{}",
                    t.ticket_id,
                    t.status,
                    t.owner.map(|o| format!(", owner {o}")).unwrap_or_default()
                ),
                Err(e) => format!("ticket not changed: {e}"),
            });
            reload(s)
        }
    }
}

/// After a replay or a ticket change, the drilled ticket is read again.
fn reload(s: &State) -> Option<Effect> {
    s.drill
        .as_ref()
        .map(|d| Effect::LoadTicket(d.ticket_id.clone()))
}

/// The drilled ticket's rows arrived (or did not); an answer for a ticket
/// no longer on screen is dropped.
fn ticket_loaded(
    s: &mut State,
    ticket_id: &TicketId,
    result: Result<(Option<Ticket>, Vec<DlqEntry>), EffectError>,
) -> Option<Effect> {
    let d = s.drill.as_mut().filter(|d| d.ticket_id == *ticket_id)?;
    match result {
        Ok((ticket, entries)) => {
            d.ticket = ticket;
            d.entries = entries;
            d.error = None;
            clamp(&mut d.selected, d.entries.len());
            precheck(d)
        }
        Err(e) => {
            d.error = Some(e);
            None
        }
    }
}

/// A dry run that would send opens the confirmation (unless read-only); a
/// blocked one only says so.
fn dry_run_done(s: &mut State, report: ReplayReport) {
    let blocked = report.decision == ReplayDecision::Blocked;
    s.status = Some(if blocked {
        format!(
            "dry run of {}: BLOCKED by a pre-check; nothing can be sent",
            report.message_id
        )
    } else {
        format!(
            "dry run of {}: would send. Type its last 6 characters ({}) to replay for real, Esc to stop",
            report.message_id,
            suffix(report.message_id.as_str())
        )
    });
    if !blocked && !s.readonly {
        s.input.clear();
        s.mode = Mode::Confirm(Confirm {
            group: report.consumer_group.clone(),
            message_id: report.message_id.clone(),
            stage: ConfirmStage::Suffix,
        });
    }
    if let Some(d) = s.drill.as_mut() {
        d.verdicts = Some(Ok(report.checks.clone()));
        d.dry_run = Some(report);
    }
}

/// The read-only pre-checks of the selected entry. An entry mirrored
/// without a message_id cannot be replayed (docs/architecture.md §9.1,
/// §9.4), so there is nothing to check: the panel says why instead.
fn precheck(d: &mut Drill) -> Option<Effect> {
    d.verdicts = None;
    d.dry_run = None;
    d.story = None;
    let e = d.entry()?;
    match e.message_id.replayable() {
        Ok(id) => Some(Effect::Precheck {
            group: e.consumer_group.clone(),
            message_id: id.clone(),
        }),
        Err(why) => {
            d.verdicts = Some(Err(EffectError::new(EffectKind::Precheck, why)));
            None
        }
    }
}

fn refreshed(s: &mut State, data: Data) {
    let keep = (HISTORY.as_millis() / s.refresh.as_millis().max(1)) as usize;
    for r in &data.backlog {
        let h = s.lag_history.entry(r.group.clone()).or_default();
        h.push_back((r.lag_seconds * 1000.0) as u64);
        while h.len() > keep.max(1) {
            h.pop_front();
        }
    }
    for c in data.components.iter().filter(|c| c.up) {
        s.last_seen.insert(c.name.clone(), data.at_ms);
    }
    s.refresh_error = None;
    s.data = Some(data);
    let (b, t) = (s.backlog().len(), s.tickets().len());
    clamp(&mut s.sel_backlog, b);
    clamp(&mut s.sel_ticket, t);
}

/// The ticket under the cursor: the drilled one, else the selected row.
fn ticket_in_view(s: &State) -> Option<TicketId> {
    match (&s.mode, &s.drill) {
        (Mode::Drill, Some(d)) => Some(d.ticket_id.clone()),
        _ => s.selected_ticket().map(|t| t.ticket_id.clone()),
    }
}

fn key(s: &mut State, k: Key) -> Option<Effect> {
    match s.mode.clone() {
        Mode::Help => {
            s.mode = if s.drill.is_some() {
                Mode::Drill
            } else {
                Mode::Normal
            };
            None
        }
        Mode::Filter => {
            match k {
                Key::Enter => {
                    s.filter = s.input.trim().to_owned();
                    s.mode = Mode::Normal;
                    s.sel_backlog = 0;
                    s.sel_ticket = 0;
                }
                Key::Esc => s.mode = Mode::Normal,
                _ => edit(&mut s.input, k),
            }
            None
        }
        Mode::Assign => match k {
            Key::Esc => {
                s.mode = back(s);
                None
            }
            Key::Enter => {
                s.mode = back(s);
                let ticket_id = ticket_in_view(s)?;
                let owner = s.input.trim().to_owned();
                Some(if owner.is_empty() {
                    Effect::Ack(ticket_id)
                } else {
                    Effect::Assign { ticket_id, owner }
                })
            }
            _ => {
                edit(&mut s.input, k);
                None
            }
        },
        Mode::Confirm(c) => confirm(s, c, k),
        Mode::Drill => drill_key(s, k),
        Mode::Normal => normal_key(s, k),
    }
}

fn back(s: &State) -> Mode {
    if s.drill.is_some() {
        Mode::Drill
    } else {
        Mode::Normal
    }
}

fn edit(input: &mut String, k: Key) {
    match k {
        Key::Char(c) if !c.is_control() && input.chars().count() < 200 => input.push(c),
        Key::Backspace => {
            input.pop();
        }
        _ => {}
    }
}

fn common(s: &mut State, k: Key) -> Option<Option<Effect>> {
    match k {
        Key::Char('q') => Some(Some(Effect::Quit)),
        Key::Char('?') => {
            s.mode = Mode::Help;
            Some(None)
        }
        Key::Char('a') if !s.readonly => {
            if ticket_in_view(s).is_none() {
                s.status = Some("no ticket selected".into());
            } else {
                s.input.clear();
                s.mode = Mode::Assign;
            }
            Some(None)
        }
        _ => None,
    }
}

fn normal_key(s: &mut State, k: Key) -> Option<Effect> {
    if let Some(e) = common(s, k) {
        return e;
    }
    match k {
        Key::Tab | Key::BackTab => {
            s.focus = match s.focus {
                Focus::Backlog => Focus::Tickets,
                Focus::Tickets => Focus::Backlog,
            };
            None
        }
        Key::Up | Key::Down => {
            let down = k == Key::Down;
            match s.focus {
                Focus::Backlog => {
                    let n = s.backlog().len();
                    step(&mut s.sel_backlog, n, down);
                }
                Focus::Tickets => {
                    let n = s.tickets().len();
                    step(&mut s.sel_ticket, n, down);
                }
            }
            None
        }
        Key::Enter => {
            if s.focus != Focus::Tickets {
                s.status = Some("Tab to the DLQ tickets, then Enter to open one".into());
                return None;
            }
            let id = s.selected_ticket()?.ticket_id.clone();
            s.drill = Some(Drill::new(id.clone()));
            s.mode = Mode::Drill;
            Some(Effect::LoadTicket(id))
        }
        Key::Char('/') => {
            s.input = s.filter.clone();
            s.mode = Mode::Filter;
            None
        }
        Key::Esc => {
            s.filter.clear();
            s.status = None;
            None
        }
        _ => None,
    }
}

fn drill_key(s: &mut State, k: Key) -> Option<Effect> {
    if let Some(e) = common(s, k) {
        return e;
    }
    let d = s.drill.as_mut()?;
    match k {
        Key::Esc => {
            s.drill = None;
            s.mode = Mode::Normal;
            None
        }
        Key::Up | Key::Down => {
            let before = d.selected;
            step(&mut d.selected, d.entries.len(), k == Key::Down);
            if d.selected != before {
                precheck(d)
            } else {
                None
            }
        }
        // Read-only: a reader may follow a message's story too.
        Key::Char('t') => {
            let e = d.entry()?;
            match e.message_id.replayable() {
                Ok(id) => {
                    s.status = Some(format!("tracing {id}…"));
                    Some(Effect::Trace(id.clone()))
                }
                Err(why) => {
                    s.status = Some(why.to_string());
                    None
                }
            }
        }
        Key::Char('r') if !s.readonly => {
            let e = d.entry()?;
            let message_id = match e.message_id.replayable() {
                Ok(id) => id.clone(),
                Err(why) => {
                    s.status = Some(why.to_string());
                    return None;
                }
            };
            s.status = Some(format!("dry run of {message_id}…"));
            Some(Effect::DryRun {
                group: e.consumer_group.clone(),
                message_id,
            })
        }
        _ => None,
    }
}

fn confirm(s: &mut State, c: Confirm, k: Key) -> Option<Effect> {
    match (k, c.stage) {
        (Key::Esc, _) => {
            s.mode = Mode::Drill;
            s.status = Some("replay not sent".into());
            None
        }
        (Key::Enter, ConfirmStage::Suffix) => {
            if s.input == suffix(c.message_id.as_str()) {
                s.input.clear();
                s.mode = Mode::Confirm(Confirm {
                    stage: ConfirmStage::Reason,
                    ..c
                });
                s.status = Some("why is this replay safe? (recorded in the audit)".into());
            } else {
                s.status = Some(format!(
                    "{:?} does not match; type the last 6 characters of {}",
                    s.input, c.message_id
                ));
                s.input.clear();
            }
            None
        }
        (Key::Enter, ConfirmStage::Reason) => {
            let reason = s.input.trim().to_owned();
            if reason.is_empty() {
                s.status = Some("a reason is required".into());
                return None;
            }
            s.input.clear();
            s.mode = Mode::Drill;
            s.status = Some(format!("replaying {}…", c.message_id));
            Some(Effect::Replay {
                group: c.group,
                message_id: c.message_id,
                reason,
            })
        }
        _ => {
            edit(&mut s.input, k);
            None
        }
    }
}
