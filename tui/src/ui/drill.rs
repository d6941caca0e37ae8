//! Inside a ticket: its messages, and the pre-check verdicts (or the dry
//! run) of the selected one.

use super::{age, panel};
use crate::state::{Drill, EffectError, State};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::widgets::{Cell, Paragraph, Row, Table, TableState};
use seckill_engine::{CheckLevel as Level, Story, StoryVerdict};

pub fn render(s: &State, f: &mut Frame, area: Rect) {
    let Some(d) = &s.drill else { return };
    let now = s.data.as_ref().map_or(0, |d| d.at_ms);
    let [top, bottom] =
        Layout::vertical([Constraint::Percentage(50), Constraint::Percentage(50)]).areas(area);
    messages(d, now, f, top);
    match &d.story {
        Some(story) => self::story(story, f, bottom),
        None => checks(d, f, bottom),
    }
}

/// The selected message's story (`t`): its timeline and verdict.
fn story(story: &Result<Story, EffectError>, f: &mut Frame, bottom: Rect) {
    let s = match story {
        Ok(s) => s,
        Err(e) => {
            f.render_widget(
                Paragraph::new(format!("trace failed: {e}")).block(panel("story", false)),
                bottom,
            );
            return;
        }
    };
    let (word, color) = match s.verdict {
        StoryVerdict::Consistent => ("CONSISTENT", Color::Green),
        StoryVerdict::InFlight => ("IN FLIGHT", Color::Yellow),
        StoryVerdict::Broken => ("BROKEN", Color::Red),
    };
    let heading = format!(
        "story of {} · reservation {} · {word}: {}",
        s.anchor, s.reservation_id, s.reason
    );
    let rows: Vec<Row> = s
        .lines
        .iter()
        .map(|l| {
            Row::new(vec![
                Cell::from(l.at.map_or("-".to_owned(), |a| a.format("%H:%M:%S%.3f").to_string())),
                Cell::from(l.source),
                Cell::from(l.event.clone()),
                Cell::from(l.detail.clone()),
            ])
        })
        .collect();
    f.render_widget(
        Table::new(
            rows,
            [
                Constraint::Length(12),
                Constraint::Length(10),
                Constraint::Length(16),
                Constraint::Min(20),
            ],
        )
        .header(
            Row::new(["AT", "SOURCE", "EVENT", "DETAIL"])
                .style(Style::new().add_modifier(Modifier::BOLD)),
        )
        .block(panel(&heading, false).border_style(Style::new().fg(color))),
        bottom,
    );
}

/// The ticket's messages, the selected one highlighted.
fn messages(d: &Drill, now: i64, f: &mut Frame, top: Rect) {
    let title = match &d.ticket {
        Some(t) => format!(
            "ticket {} · {} · {} · {} · owner {}",
            t.ticket_id,
            t.status,
            t.error_class,
            t.consumer_group,
            t.owner.as_deref().unwrap_or("-")
        ),
        None => format!("ticket {} (loading)", d.ticket_id),
    };
    let rows: Vec<Row> = d
        .entries
        .iter()
        .map(|e| {
            Row::new(vec![
                Cell::from(e.message_id.to_string()),
                Cell::from(e.status.to_string()),
                Cell::from(e.delivery_attempts.to_string()),
                Cell::from(e.replay_count.to_string()),
                Cell::from(age(now - e.dead_at.timestamp_millis())),
            ])
        })
        .collect();
    let table = Table::new(
        rows,
        [
            Constraint::Min(30),
            Constraint::Length(10),
            Constraint::Length(9),
            Constraint::Length(8),
            Constraint::Length(6),
        ],
    )
    .header(
        Row::new(["MESSAGE", "STATUS", "ATTEMPTS", "REPLAYS", "DEAD"])
            .style(Style::new().add_modifier(Modifier::BOLD)),
    )
    .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
    .block(panel(&title, true));
    let mut ts = TableState::default();
    ts.select((!d.entries.is_empty()).then_some(d.selected));
    f.render_stateful_widget(table, top, &mut ts);
}

/// The selected message's pre-check verdicts, or its dry run.
fn checks(d: &Drill, f: &mut Frame, bottom: Rect) {
    let heading = match (&d.dry_run, d.entry()) {
        (Some(r), _) => format!("dry run of {}: {}", r.message_id, r.decision),
        (None, Some(e)) => format!("pre-checks of {} (read-only)", e.message_id),
        (None, None) => "pre-checks".to_owned(),
    };
    let block = panel(&heading, false);
    match (&d.error, &d.verdicts) {
        (Some(e), _) => f.render_widget(
            Paragraph::new(format!("cannot load the ticket: {e}")).block(block),
            bottom,
        ),
        (None, None) => f.render_widget(Paragraph::new("…").block(block), bottom),
        (None, Some(Err(e))) => f.render_widget(
            Paragraph::new(format!("pre-checks failed: {e}")).block(block),
            bottom,
        ),
        (None, Some(Ok(v))) => {
            let rows: Vec<Row> = v
                .iter()
                .map(|v| {
                    let style = match v.level {
                        Level::Pass => Style::new().fg(Color::Green),
                        Level::Warn => Style::new().fg(Color::Yellow),
                        Level::Block => Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
                    };
                    Row::new(vec![
                        Cell::from(v.check.as_str()),
                        Cell::from(format!("{:?}", v.level).to_uppercase()).style(style),
                        Cell::from(v.evidence.clone()),
                    ])
                })
                .collect();
            f.render_widget(
                Table::new(
                    rows,
                    [
                        Constraint::Length(14),
                        Constraint::Length(7),
                        Constraint::Min(20),
                    ],
                )
                .header(
                    Row::new(["CHECK", "VERDICT", "EVIDENCE"])
                        .style(Style::new().add_modifier(Modifier::BOLD)),
                )
                .block(block),
                bottom,
            );
        }
    }
}
