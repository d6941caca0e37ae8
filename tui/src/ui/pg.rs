//! PostgreSQL: the engine's pool as a gauge, wait p95, transaction p99,
//! lock waiters.

use super::panel;
use crate::state::State;
use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Style};
use ratatui::text::Line;
use ratatui::widgets::{Gauge, Paragraph};

pub fn render(s: &State, f: &mut Frame, area: Rect) {
    let block = panel("postgresql", false);
    let inner = block.inner(area);
    f.render_widget(block, area);
    let [gauge, text] = Layout::vertical([Constraint::Length(1), Constraint::Min(1)]).areas(inner);
    let pg = s.data.as_ref().map(|d| &d.pg);
    match pg.and_then(|p| p.pool.as_ref()) {
        Some(p) => {
            let ratio = if p.max == 0 {
                0.0
            } else {
                p.in_use as f64 / p.max as f64
            };
            let color = if ratio > 0.9 {
                Color::Red
            } else if ratio > 0.7 {
                Color::Yellow
            } else {
                Color::Green
            };
            f.render_widget(
                Gauge::default()
                    .gauge_style(Style::new().fg(color))
                    .ratio(ratio.clamp(0.0, 1.0))
                    .label(format!("pool {}/{} in use", p.in_use, p.max)),
                gauge,
            );
        }
        None => f.render_widget(Paragraph::new("pool: no engine"), gauge),
    }
    let ms = |v: Option<f64>| v.map_or("-".into(), |v| format!("{v:.1} ms"));
    let mut lines = vec![Line::from(format!(
        "wait p95 {}   tx p99 {}",
        ms(pg
            .and_then(|p| p.pool.as_ref())
            .map(|p| p.acquire_wait_p95_ms)),
        ms(pg.and_then(|p| p.order_tx_p99_ms)),
    ))];
    match pg.and_then(|p| p.server.as_ref()) {
        Some(sv) => {
            lines.push(Line::from(format!(
                "lock waiters {}   active {}   idle in tx {}",
                sv.lock_waiters, sv.active, sv.idle_in_transaction
            )));
            lines.push(Line::from(format!(
                "commits {}   WAL {}   longest tx {:.1}s",
                sv.commits_per_s.map_or("-".into(), |c| format!("{c:.0}/s")),
                sv.wal_bytes_per_s
                    .map_or("-".into(), |b| format!("{:.0} KiB/s", b / 1024.0)),
                sv.longest_tx_s
            )));
        }
        None => lines.push(Line::from("server: unreadable")),
    }
    f.render_widget(Paragraph::new(lines), text);
}
