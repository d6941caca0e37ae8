//! The engine daemons (docs/architecture.md §14.3, §14.4): one line each,
//! live or dead, with what it carries and the singletons it runs.

use super::{age, panel};
use crate::state::State;
use ratatui::Frame;
use ratatui::layout::Rect;
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::{Line, Span};
use ratatui::widgets::Paragraph;
use seckill_engine::{EngineRow, Seen, Singleton};

/// Rows the panel shows before it says how many more there are.
pub const SHOWN: usize = 4;

/// The panel's height for `n` daemons: nothing without any.
pub fn height(n: usize) -> u16 {
    if n == 0 { 0 } else { n.min(SHOWN) as u16 + 2 }
}

pub fn render(s: &State, f: &mut Frame, area: Rect) {
    let rows: &[EngineRow] = s.data.as_ref().map_or(&[], |d| d.engines.as_slice());
    let live = rows.iter().filter(|e| e.seen == Seen::Answered).count();
    let block = panel(&format!("engines: {live} live of {}", rows.len()), false);
    let mut lines: Vec<Line> = rows.iter().take(SHOWN).map(line).collect();
    if rows.len() > SHOWN
        && let Some(last) = lines.last_mut()
    {
        *last = Line::from(format!(
            "… and {} more (`seckillctl engines`)",
            rows.len() - SHOWN + 1
        ));
    }
    f.render_widget(Paragraph::new(lines).block(block), area);
}

fn line(e: &EngineRow) -> Line<'static> {
    let name = e.id.as_deref().map_or_else(|| e.url.clone(), short_id);
    let roles = Singleton::cell(&e.roles, ",");
    let (mark, state, style) = match e.seen {
        Seen::Answered => ("●", "live".to_owned(), Style::new().fg(Color::Green)),
        Seen::Unreachable => (
            "✗",
            "UNREACHABLE".to_owned(),
            Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
        ),
        Seen::Silent => (
            "✗",
            format!("DEAD silent {}", e.heartbeat_age_ms.map_or("?".into(), age)),
            Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
        ),
        Seen::Stopped => ("○", "stopped".to_owned(), Style::new().fg(Color::DarkGray)),
    };
    let figures = match e.seen {
        Seen::Answered => format!(
            "inflight {} orders {} pool {}/{} p99 {:.0}ms {}",
            e.inflight.unwrap_or(0),
            e.orders_created.unwrap_or(0),
            e.pool_in_use.unwrap_or(0),
            e.pool_max.unwrap_or(0),
            e.order_tx_p99_ms.unwrap_or(0.0),
            e.send_circuit.as_deref().unwrap_or("-"),
        ),
        _ => e.url.clone(),
    };
    Line::from(vec![
        Span::styled(format!("{mark} {state:<17} "), style),
        Span::raw(format!("{name:<20} ")),
        Span::styled(format!("{roles:<26} "), Style::new().fg(Color::Cyan)),
        Span::raw(figures),
    ])
}

/// `engine-<pid>-<ulid>` as `engine-<pid>-…<last 6>`: enough to tell the
/// daemons apart on one screen; `seckillctl engines` has the whole id.
fn short_id(id: &str) -> String {
    match id.rsplit_once('-') {
        Some((head, ulid)) if ulid.len() > 8 => {
            format!("{head}-…{}", &ulid[ulid.len() - 6..])
        }
        _ => id.to_owned(),
    }
}
