//! Components up or down (with when each was last seen) and the worst alert.

use super::{age, alert_style};
use crate::state::State;
use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph};

pub fn render(s: &State, f: &mut Frame, area: Rect) {
    let mut spans = vec![Span::styled(
        "seckillctl tui ",
        Style::new().add_modifier(Modifier::BOLD),
    )];
    match &s.data {
        None => spans.push(Span::raw(match &s.refresh_error {
            Some(e) => format!("│ no data: {e}"),
            None => "│ connecting…".to_owned(),
        })),
        Some(d) => {
            for c in &d.components {
                spans.push(Span::raw("│ "));
                if c.up {
                    spans.push(Span::styled(
                        format!("● {} ", c.name),
                        Style::new().fg(Color::Green),
                    ));
                } else {
                    let seen = s
                        .last_seen
                        .get(&c.name)
                        .map_or("never seen".to_owned(), |t| {
                            format!("last seen {} ago", age(d.at_ms - t))
                        });
                    spans.push(Span::styled(
                        format!("○ {} DOWN ({seen}) ", c.name),
                        Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
                    ));
                }
            }
            if let Some(age_ms) = s.stale_ms() {
                spans.push(Span::styled(
                    format!("│ STALE: last refresh {} ago ", age(age_ms)),
                    Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
                ));
            }
            spans.push(Span::raw("│ "));
            match d.worst_alert() {
                Some(a) => spans.push(Span::styled(
                    format!(
                        "{}: {} = {}",
                        format!("{:?}", a.state).to_uppercase(),
                        a.metric,
                        a.shown
                    ),
                    alert_style(a.state),
                )),
                None => spans.push(Span::styled(
                    "no alert firing",
                    Style::new().fg(Color::Green),
                )),
            }
        }
    }
    f.render_widget(
        Paragraph::new(Line::from(spans)).block(Block::default().borders(Borders::ALL)),
        area,
    );
}
