//! The alerts strip: every firing docs/architecture.md §11.2 alert with its runbook.

use super::alert_style;
use crate::state::State;
use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use seckill_engine::AlertState;

pub fn render(s: &State, f: &mut Frame, area: Rect) {
    let block = super::panel("alerts", false);
    let mut lines: Vec<Line> = s
        .data
        .iter()
        .flat_map(|d| &d.alerts)
        .filter(|a| a.state.firing())
        .map(|a| {
            Line::from(vec![
                Span::styled(
                    format!("{:?} ", a.state).to_uppercase(),
                    alert_style(a.state),
                ),
                Span::raw(format!(
                    "{} = {} ({})  → {}",
                    a.metric, a.shown, a.thresholds, a.runbook
                )),
            ])
        })
        .collect();
    let blind: Vec<&str> = s
        .data
        .iter()
        .flat_map(|d| &d.alerts)
        .filter(|a| a.state == AlertState::NoData)
        .map(|a| a.metric)
        .collect();
    if !blind.is_empty() {
        lines.push(Line::from(Span::styled(
            format!("NO DATA (source down): {}", blind.join(", ")),
            Style::new().fg(Color::DarkGray),
        )));
    }
    if lines.is_empty() {
        lines.push(Line::from(Span::styled(
            if s.data.is_some() {
                "all alerts OK"
            } else {
                "waiting for the first refresh"
            },
            Style::new().fg(Color::Green),
        )));
    }
    f.render_widget(Paragraph::new(lines).block(block), area);
}
