//! Where the binary's logs go and in what shape (docs/architecture.md
//! §11.3): text for people, `tracing`'s JSON for machines. The daemon under
//! a service manager or a pipe writes JSON by default; every other command
//! writes text on stderr, so its stdout stays its output.

use seckill_engine::LogFormat;
use std::io::IsTerminal;

/// The format one process writes, once `auto` is decided.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Shape {
    Text,
    Json,
}

/// `flag` (`--log-format`, env `SECKILL_LOG_FORMAT`) wins over `config`
/// (`[log] format`); `auto` means JSON for the daemon whose stdout is not
/// a terminal, text otherwise. Pure.
pub fn shape(flag: Option<LogFormat>, config: LogFormat, daemon: bool, stdout_tty: bool) -> Shape {
    match flag.unwrap_or(config) {
        LogFormat::Json => Shape::Json,
        LogFormat::Text => Shape::Text,
        LogFormat::Auto if daemon && !stdout_tty => Shape::Json,
        LogFormat::Auto => Shape::Text,
    }
}

pub fn stdout_is_terminal() -> bool {
    std::io::stdout().is_terminal()
}

/// Installs the subscriber: `filter` (`--log`, or `RUST_LOG`) in `shape`,
/// on stderr.
pub fn init(filter: &str, shape: Shape) {
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter));
    let fmt = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    match shape {
        // One object per line: the event's fields at the top level beside
        // `timestamp`, `level`, `target` and `message`, and the span it
        // happened in, so `jq` can select on any of them.
        Shape::Json => fmt
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .init(),
        Shape::Text => fmt.init(),
    }
}

/// No log at all (the TUI draws its own errors; log lines would tear its
/// screen apart).
pub fn off() {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::new("off"))
        .with_writer(std::io::sink)
        .init();
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_flag_wins_and_auto_means_json_only_for_a_daemon_off_a_terminal() {
        use LogFormat::*;
        assert_eq!(shape(None, Auto, true, false), Shape::Json);
        assert_eq!(shape(None, Auto, true, true), Shape::Text);
        assert_eq!(
            shape(None, Auto, false, false),
            Shape::Text,
            "a CLI command in a pipe"
        );
        assert_eq!(shape(None, Json, false, true), Shape::Json);
        assert_eq!(shape(Some(Text), Json, true, false), Shape::Text);
        assert_eq!(shape(Some(Json), Text, false, true), Shape::Json);
    }
}
