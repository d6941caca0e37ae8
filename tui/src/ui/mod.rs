//! `render(&State, &mut Frame)`: draws only. One module per screen region.

mod alerts;
mod backlog;
mod dlq;
mod drill;
mod engines;
mod header;
mod help;
mod pending;
mod pg;

use crate::state::{Mode, State};
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::{Block, Borders, Paragraph};
use seckill_engine::{AlertState, Level};

pub fn render(s: &State, f: &mut Frame) {
    // Every firing alert gets its line (up to all eight), plus the NO DATA line.
    let strip_lines = s.data.as_ref().map_or(1, |d| {
        let firing = d.alerts.iter().filter(|a| a.state.firing()).count();
        let blind = d.alerts.iter().any(|a| a.state == AlertState::NoData);
        (firing + usize::from(blind)).max(1)
    }) as u16;
    let [head, body, strip, foot] = Layout::vertical([
        Constraint::Length(3),
        Constraint::Min(10),
        Constraint::Length(strip_lines + 2),
        Constraint::Length(2),
    ])
    .areas(f.area());
    header::render(s, f, head);
    if s.drill.is_some() && !matches!(s.mode, Mode::Normal) {
        drill::render(s, f, body);
    } else {
        let daemons = s.data.as_ref().map_or(0, |d| d.engines.len());
        let [top, fleet, middle, bottom] = Layout::vertical([
            Constraint::Length(8),
            Constraint::Length(engines::height(daemons)),
            Constraint::Length(9),
            Constraint::Min(5),
        ])
        .areas(body);
        backlog::render(s, f, top);
        if daemons > 0 {
            engines::render(s, f, fleet);
        }
        let [left, right] =
            Layout::horizontal([Constraint::Percentage(45), Constraint::Percentage(55)])
                .areas(middle);
        pending::render(s, f, left);
        pg::render(s, f, right);
        dlq::render(s, f, bottom);
    }
    alerts::render(s, f, strip);
    footer(s, f, foot);
    if s.mode == Mode::Help {
        help::render(s, f);
    }
}

fn footer(s: &State, f: &mut Frame, area: Rect) {
    let prompt = match &s.mode {
        Mode::Filter => Some(format!("filter: {}▏ (Enter apply, Esc cancel)", s.input)),
        Mode::Assign => Some(format!(
            "assign to: {}▏ (Enter; empty acknowledges; Esc cancel)",
            s.input
        )),
        Mode::Confirm(c) => Some(match c.stage {
            crate::state::ConfirmStage::Suffix => format!(
                "REPLAY {} for real? type its last 6 characters: {}▏ (Esc cancels)",
                c.message_id, s.input
            ),
            crate::state::ConfirmStage::Reason => {
                format!("reason: {}▏ (Enter replays, Esc cancels)", s.input)
            }
        }),
        _ => None,
    };
    let keys = if s.readonly {
        "↑↓ select  Tab panel  Enter open  / filter  ? help  q quit   [read-only]"
    } else {
        "↑↓ select  Tab panel  Enter open  r dry-run/replay  a ack/assign  / filter  ? help  q quit"
    };
    let first = match prompt {
        Some(p) => Line::from(Span::styled(
            p,
            Style::new().fg(Color::Yellow).add_modifier(Modifier::BOLD),
        )),
        None => Line::from(s.status.clone().unwrap_or_default()),
    };
    let filter = if s.filter.is_empty() {
        String::new()
    } else {
        format!("   filter: {}", s.filter)
    };
    f.render_widget(
        Paragraph::new(vec![
            first,
            Line::from(format!("{keys}{filter}")).style(Style::new().fg(Color::DarkGray)),
        ]),
        area,
    );
}

pub(crate) fn panel(title: &str, focused: bool) -> Block<'static> {
    let style = if focused {
        Style::new().fg(Color::Cyan)
    } else {
        Style::new()
    };
    Block::default()
        .borders(Borders::ALL)
        .border_style(style)
        .title(format!(" {title} "))
}

pub(crate) fn level_style(l: Level) -> Style {
    match l {
        Level::Ok => Style::new().fg(Color::Green),
        Level::Warn => Style::new().fg(Color::Yellow),
        Level::Critical => Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
    }
}

pub(crate) fn alert_style(a: AlertState) -> Style {
    match a {
        AlertState::NoData => Style::new().fg(Color::DarkGray),
        AlertState::Ok => Style::new().fg(Color::Green),
        AlertState::Warn => Style::new().fg(Color::Yellow),
        AlertState::Critical => Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
    }
}

pub(crate) fn level_name(l: Level) -> &'static str {
    match l {
        Level::Ok => "OK",
        Level::Warn => "WARN",
        Level::Critical => "CRITICAL",
    }
}

/// A text sparkline of lag milliseconds, newest on the right, scaled to
/// the window's maximum but never below 1 s (the lag warning), so a calm
/// 0.3 s does not fill the cell.
pub(crate) fn sparkline(values: impl Iterator<Item = u64> + Clone, width: usize) -> String {
    const BARS: [char; 8] = ['▁', '▂', '▃', '▄', '▅', '▆', '▇', '█'];
    let v: Vec<u64> = values.collect();
    let tail = &v[v.len().saturating_sub(width)..];
    let max = tail.iter().copied().max().unwrap_or(0).max(1_000);
    tail.iter()
        .map(|x| {
            if max == 0 {
                BARS[0]
            } else {
                BARS[((*x as f64 / max as f64) * 7.0).round() as usize]
            }
        })
        .collect()
}

pub(crate) fn secs(v: Option<f64>) -> String {
    v.map_or("-".into(), |s| format!("{s:.1}s"))
}

/// "12s", "4m", "3h" ago.
pub(crate) fn age(ms: i64) -> String {
    let s = (ms.max(0)) / 1000;
    match s {
        0..=119 => format!("{s}s"),
        120..=7199 => format!("{}m", s / 60),
        _ => format!("{}h", s / 3600),
    }
}
