//! Open DLQ tickets: owner, error class, count and age.

use super::{age, panel};
use crate::state::{Focus, State};
use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::widgets::{Cell, Row, Table, TableState};

pub fn render(s: &State, f: &mut Frame, area: Rect) {
    let now = s.data.as_ref().map_or(0, |d| d.at_ms);
    let tickets = s.tickets();
    let rows: Vec<Row> = tickets
        .iter()
        .map(|t| {
            let dead = if t.dead > 0 {
                Style::new().fg(Color::Red)
            } else {
                Style::new()
            };
            Row::new(vec![
                Cell::from(t.ticket_id.to_string()),
                Cell::from(t.status.to_string()),
                Cell::from(t.owner.clone().unwrap_or_else(|| "-".into())),
                Cell::from(t.error_class.to_string()),
                Cell::from(t.consumer_group.clone()),
                Cell::from(format!("{}/{}", t.dead, t.messages)).style(dead),
                Cell::from(age(now - t.opened_at.timestamp_millis())),
            ])
        })
        .collect();
    let empty = tickets.is_empty();
    let table = Table::new(
        rows,
        [
            Constraint::Length(30),
            Constraint::Length(10),
            Constraint::Length(12),
            Constraint::Length(18),
            Constraint::Min(20),
            Constraint::Length(9),
            Constraint::Length(5),
        ],
    )
    .header(
        Row::new([
            "TICKET",
            "STATUS",
            "OWNER",
            "ERROR CLASS",
            "GROUP",
            "DEAD/ALL",
            "AGE",
        ])
        .style(Style::new().add_modifier(Modifier::BOLD)),
    )
    .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
    .block(panel(
        &match s.data.as_ref().and_then(|d| d.tickets_error.as_deref()) {
            Some(e) => format!("DLQ tickets: unreadable ({e})"),
            None if empty => "DLQ tickets: none open".to_owned(),
            None => "DLQ tickets".to_owned(),
        },
        s.focus == Focus::Tickets,
    ));
    let mut ts = TableState::default();
    if s.focus == Focus::Tickets && !empty {
        ts.select(Some(s.sel_ticket));
    }
    f.render_stateful_widget(table, area, &mut ts);
}
