//! `seckill-tui`: the live on-call screen (`seckillctl tui`).
//!
//! Layout (STYLE.md, TUI): [`state`] is plain data, [`update`] turns a
//! [`update::Msg`] into state changes and an optional [`update::Effect`]
//! without I/O, [`ui`] draws (one module per panel), and [`app`] runs the
//! loop and carries out the effects through the engine's own functions
//! (`observe`, `dlq`), never its own SQL.

pub mod app;
pub mod state;
pub mod ui;
pub mod update;

#[cfg(test)]
mod tests;

pub use app::{Options, run};
