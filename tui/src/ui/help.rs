//! The `?` overlay.

use crate::state::State;
use ratatui::Frame;
use ratatui::layout::{Constraint, Flex, Layout};
use ratatui::widgets::{Block, Borders, Clear, Paragraph};

pub fn render(s: &State, f: &mut Frame) {
    let mut lines = vec![
        "↑ ↓        select a row (a message, inside a ticket)",
        "Tab        switch between backlog and DLQ tickets",
        "Enter      open the selected ticket: its messages and pre-check verdicts",
        "Esc        back; on the main screen, clear the filter",
        "/          filter groups and tickets",
        "t          (in a ticket) the selected message's story: every store, one timeline",
    ];
    if !s.readonly {
        lines.extend([
            "r          (in a ticket) dry-run the replay of the selected message;",
            "           then type its last 6 characters and a reason to replay for real",
            "a          acknowledge (empty name) or assign the ticket",
        ]);
    }
    lines.extend(["?          this help", "q          quit"]);
    let [area] = Layout::horizontal([Constraint::Length(80)])
        .flex(Flex::Center)
        .areas(f.area());
    let [area] = Layout::vertical([Constraint::Length(lines.len() as u16 + 2)])
        .flex(Flex::Center)
        .areas(area);
    f.render_widget(Clear, area);
    f.render_widget(
        Paragraph::new(lines.join("\n"))
            .block(Block::default().borders(Borders::ALL).title(" keys ")),
        area,
    );
}
