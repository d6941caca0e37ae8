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
/// on stderr; and, given `otlp` (a daemon's `[log] otlp_endpoint`), the
/// engine's stage spans exported over OTLP/HTTP. The returned guard
/// flushes the spans still queued when it drops, at exit.
///
/// Call it before the runtime starts: the exporter's blocking HTTP client
/// must not be built inside one.
pub fn init(filter: &str, shape: Shape, otlp: Option<&str>) -> Result<Telemetry, OtlpError> {
    use tracing_subscriber::Layer;
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;

    let user = std::env::var("RUST_LOG")
        .ok()
        .filter(|v| !v.trim().is_empty())
        .unwrap_or_else(|| filter.to_owned());
    let filter = tracing_subscriber::EnvFilter::try_new(directives(&user, otlp.is_some()))
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new(filter));
    let fmt = tracing_subscriber::fmt::layer().with_writer(std::io::stderr);
    let fmt = match shape {
        // One object per line: the event's fields at the top level beside
        // `timestamp`, `level`, `target` and `message`, and the span it
        // happened in, so `jq` can select on any of them.
        Shape::Json => fmt
            .json()
            .flatten_event(true)
            .with_current_span(true)
            .with_span_list(false)
            .boxed(),
        Shape::Text => fmt.boxed(),
    };
    let subscriber = tracing_subscriber::registry().with(filter).with(fmt);
    let (otel, telemetry) = match otlp {
        Some(endpoint) => otlp::layer(endpoint)?,
        None => (None, Telemetry::default()),
    };
    subscriber.with(otel).init();
    Ok(telemetry)
}

/// The one filter of every layer: `user`'s directives (`--log` or
/// `RUST_LOG`), and with an exporter the engine at INFO at least, the
/// level of its stage spans, unless `user` names the engine itself (the
/// later directive wins). One filter, not one a layer: per-layer filters
/// lost the ingress lines and most spans here (tokio-rs/tracing#2929 and
/// its kin), so the log shows the engine's INFO lines (one a batch) while
/// spans are exported. Pure.
pub fn directives(user: &str, exporting: bool) -> String {
    if exporting {
        format!("seckill_engine=info,{user}")
    } else {
        user.to_owned()
    }
}

/// Why the OTLP exporter could not start: the daemon refuses to run
/// rather than drop its spans without a word.
#[derive(Debug, thiserror::Error)]
pub enum OtlpError {
    #[error(
        "[log] otlp_endpoint {0:?} is not an http:// or https:// address; give e.g. http://127.0.0.1:4318 (or unset SECKILL_OTLP_ENDPOINT)"
    )]
    BadEndpoint(String),
    #[cfg_attr(feature = "otlp", allow(dead_code))]
    #[error(
        "[log] otlp_endpoint is set but this seckillctl was built without the `otlp` feature; rebuild with `cargo build --release --features otlp` (on by default), or unset the endpoint"
    )]
    NotBuiltIn,
    #[cfg_attr(not(feature = "otlp"), allow(dead_code))]
    #[error("cannot start the OTLP exporter for {endpoint}: {detail}")]
    Exporter { endpoint: String, detail: String },
}

/// The URL spans are posted to: a bare address (no path, or `/`) means
/// the collector's standard `/v1/traces`, as the OpenTelemetry SDKs read
/// `OTEL_EXPORTER_OTLP_ENDPOINT`; a URL with a path is used as it is. Pure.
pub fn traces_url(endpoint: &str) -> Result<String, OtlpError> {
    let e = endpoint.trim();
    let rest = e
        .strip_prefix("http://")
        .or_else(|| e.strip_prefix("https://"))
        .filter(|r| !r.is_empty() && !r.starts_with('/') && !r.contains(char::is_whitespace))
        .ok_or_else(|| OtlpError::BadEndpoint(endpoint.to_owned()))?;
    Ok(match rest.split_once('/') {
        None => format!("{e}/v1/traces"),
        Some((_, "")) => format!("{e}v1/traces"),
        Some(_) => e.to_owned(),
    })
}

/// Flushes the exporter's queue when dropped (a no-op without one).
#[derive(Default)]
#[must_use = "dropping it at once shuts the exporter down"]
pub struct Telemetry {
    #[cfg(feature = "otlp")]
    provider: Option<opentelemetry_sdk::trace::SdkTracerProvider>,
}

impl Drop for Telemetry {
    fn drop(&mut self) {
        #[cfg(feature = "otlp")]
        if let Some(p) = self.provider.take() {
            // A collector that is down costs the exporter's timeout, once,
            // at exit; the spans it could not take are lost, not retried.
            if let Err(e) = p.shutdown() {
                eprintln!("warning: the OTLP exporter did not flush its last spans: {e}");
            }
        }
    }
}

#[cfg(feature = "otlp")]
mod otlp {
    use super::{OtlpError, Telemetry, traces_url};
    use opentelemetry::trace::TracerProvider as _;
    use opentelemetry_otlp::WithExportConfig;
    use std::time::Duration;
    use tracing_subscriber::Layer;

    /// The engine's stage spans (`publish`, `resend`, `consume`,
    /// `lifecycle`), each linked to the traces of its messages
    /// (docs/architecture.md §11.5); [`super::directives`] keeps them on.
    pub fn layer<S>(endpoint: &str) -> Result<(Option<impl Layer<S>>, Telemetry), OtlpError>
    where
        S: tracing::Subscriber + for<'a> tracing_subscriber::registry::LookupSpan<'a>,
    {
        let url = traces_url(endpoint)?;
        let exporter = opentelemetry_otlp::SpanExporter::builder()
            .with_http()
            .with_endpoint(url.clone())
            .with_timeout(Duration::from_secs(5))
            .build()
            .map_err(|e| OtlpError::Exporter {
                endpoint: url,
                detail: e.to_string(),
            })?;
        let provider = opentelemetry_sdk::trace::SdkTracerProvider::builder()
            .with_batch_exporter(exporter)
            .with_resource(
                opentelemetry_sdk::Resource::builder()
                    .with_service_name("seckill-engine")
                    .build(),
            )
            .build();
        let tracer = provider.tracer("seckill-engine");
        let layer = tracing_opentelemetry::layer().with_tracer(tracer);
        Ok((
            Some(layer),
            Telemetry {
                provider: Some(provider),
            },
        ))
    }
}

#[cfg(not(feature = "otlp"))]
mod otlp {
    use super::{OtlpError, Telemetry, traces_url};
    use tracing_subscriber::layer::Identity;

    pub fn layer(endpoint: &str) -> Result<(Option<Identity>, Telemetry), OtlpError> {
        traces_url(endpoint)?;
        Err(OtlpError::NotBuiltIn)
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
    fn an_exporter_keeps_the_engine_at_info_unless_the_operator_names_it() {
        use tracing_subscriber::EnvFilter;
        assert_eq!(directives("warn", false), "warn");
        let exporting = directives("warn", true);
        assert_eq!(exporting, "seckill_engine=info,warn");
        let hint = |spec: &str| EnvFilter::try_new(spec).unwrap().max_level_hint();
        assert_eq!(
            hint(&exporting),
            Some(tracing::level_filters::LevelFilter::INFO)
        );
        assert_eq!(
            hint(&directives("seckill_engine=debug,warn", true)),
            Some(tracing::level_filters::LevelFilter::DEBUG),
            "the operator's own engine directive comes later and wins"
        );
    }

    #[test]
    fn a_bare_collector_address_means_its_traces_path() {
        for (given, url) in [
            ("http://127.0.0.1:4318", "http://127.0.0.1:4318/v1/traces"),
            ("http://127.0.0.1:4318/", "http://127.0.0.1:4318/v1/traces"),
            (" https://otel.internal ", "https://otel.internal/v1/traces"),
            (
                "http://gw:4318/otlp/v1/traces",
                "http://gw:4318/otlp/v1/traces",
            ),
        ] {
            assert_eq!(traces_url(given).unwrap(), url, "{given:?}");
        }
        for bad in [
            "",
            "127.0.0.1:4318",
            "grpc://x:4317",
            "http://",
            "http:///v1/traces",
            "http://a b",
        ] {
            assert!(
                matches!(traces_url(bad), Err(OtlpError::BadEndpoint(_))),
                "{bad:?}"
            );
        }
    }

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
