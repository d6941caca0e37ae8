//! One row per consumer group: lag, a 5-minute lag_seconds sparkline, the
//! drain ETA and the verdict in its colour.

use super::{level_name, level_style, panel, secs, sparkline};
use crate::state::{Focus, State};
use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::widgets::{Cell, Row, Table, TableState};
use seckill_engine::Drain;

pub fn render(s: &State, f: &mut Frame, area: Rect) {
    let rows: Vec<Row> = s
        .backlog()
        .into_iter()
        .map(|r| {
            let spark = s
                .lag_history
                .get(&r.group)
                .map(|h| sparkline(h.iter().copied(), 30))
                .unwrap_or_default();
            Row::new(vec![
                Cell::from(r.group.clone()),
                Cell::from(r.lag_messages.to_string()),
                Cell::from(format!("{:.1}s", r.lag_seconds)),
                Cell::from(spark),
                Cell::from(match r.drain {
                    None => "-".into(),
                    Some(Drain::Empty) => "empty".into(),
                    Some(Drain::In(t)) => format!("{t:.1}s"),
                    Some(Drain::Never) => "never".into(),
                }),
                Cell::from(secs(r.seconds_to_oldest_expiry)),
                Cell::from(level_name(r.verdict)).style(level_style(r.verdict)),
            ])
        })
        .collect();
    let down = s
        .data
        .iter()
        .flat_map(|d| &d.components)
        .find(|c| c.name == "rocketmq" && !c.up);
    let title = match down {
        Some(c) => format!(
            "backlog: RocketMQ unreachable, no lag data ({})",
            c.error.as_deref().unwrap_or("?")
        ),
        None => "backlog".to_owned(),
    };
    let table = Table::new(
        rows,
        [
            Constraint::Min(30),
            Constraint::Length(9),
            Constraint::Length(8),
            Constraint::Length(31),
            Constraint::Length(9),
            Constraint::Length(10),
            Constraint::Length(9),
        ],
    )
    .header(
        Row::new([
            "GROUP", "LAG MSGS", "LAG", "LAG 5m", "DRAIN", "EXPIRY", "VERDICT",
        ])
        .style(Style::new().add_modifier(Modifier::BOLD)),
    )
    .row_highlight_style(Style::new().add_modifier(Modifier::REVERSED))
    .block(panel(&title, s.focus == Focus::Backlog));
    let mut ts = TableState::default();
    if s.focus == Focus::Backlog {
        ts.select(Some(s.sel_backlog));
    }
    f.render_stateful_widget(table, area, &mut ts);
}
