//! Pending reservations: count and oldest age per activity.

use super::{level_name, level_style, panel, secs};
use crate::state::State;
use ratatui::Frame;
use ratatui::layout::{Constraint, Rect};
use ratatui::style::{Modifier, Style};
use ratatui::widgets::{Cell, Row, Table};

pub fn render(s: &State, f: &mut Frame, area: Rect) {
    let rows: Vec<Row> = s
        .data
        .iter()
        .flat_map(|d| &d.pending)
        .map(|p| {
            Row::new(vec![
                Cell::from(p.activity_id.to_string()),
                Cell::from(p.count.to_string()),
                Cell::from(secs(p.oldest_age_s)),
                Cell::from(p.expiring.to_string()),
                Cell::from(level_name(p.verdict)).style(level_style(p.verdict)),
            ])
        })
        .collect();
    let table = Table::new(
        rows,
        [
            Constraint::Min(10),
            Constraint::Length(8),
            Constraint::Length(8),
            Constraint::Length(9),
            Constraint::Length(9),
        ],
    )
    .header(
        Row::new(["ACTIVITY", "PENDING", "OLDEST", "EXPIRING", "VERDICT"])
            .style(Style::new().add_modifier(Modifier::BOLD)),
    )
    .block(panel("pending", false));
    f.render_widget(table, area);
}
