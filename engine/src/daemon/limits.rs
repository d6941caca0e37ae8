//! The API's limits (docs/architecture.md §13.2, "Limits"): what one
//! request may bring and hold. Each refusal is a JSON [`ApiError`] like
//! every other, and none buffers more than its limit:
//!
//! - in flight: one request past `[http] max_concurrent` is answered 503
//!   `OVERLOADED` with `Retry-After` at once, never queued (a queue would
//!   only turn an overload into timeouts);
//! - headers: the request line and headers past `max_header_bytes` get
//!   431 (hyper has already bounded what it buffered for them);
//! - time: a request past its deadline is dropped and answered 503
//!   `TIMED_OUT`, retryable;
//! - body: past `max_body_bytes`, the JSON extractors (`body.rs`) answer
//!   413 and drop the rest of the body, so the connection stays usable.

use crate::config::HttpConfig;
use crate::daemon::body::refuse_unread;
use crate::daemon::state::reject;
use axum::extract::{Request, State};
use axum::http::{HeaderValue, StatusCode, header};
use axum::middleware::Next;
use axum::response::Response;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Semaphore;

/// The limits one router enforces, shared by its requests.
#[derive(Clone)]
pub struct Limits {
    slots: Arc<Semaphore>,
    max_concurrent: usize,
    max_header_bytes: usize,
    timeout: Duration,
}

impl Limits {
    /// The public API's limits, from `[http]`.
    pub fn api(cfg: &HttpConfig) -> Limits {
        Limits::new(cfg, Duration::from_millis(cfg.request_timeout_ms.max(1)))
    }

    /// `[http]` with another deadline: the operator API holds requests
    /// on purpose while it waits, up to its own cap.
    pub fn new(cfg: &HttpConfig, timeout: Duration) -> Limits {
        let max_concurrent = cfg.max_concurrent.max(1);
        Limits {
            slots: Arc::new(Semaphore::new(max_concurrent)),
            max_concurrent,
            max_header_bytes: cfg.max_header_bytes,
            timeout,
        }
    }

    /// The same slots (one bound for the whole address) with `timeout`.
    pub fn with_timeout(&self, timeout: Duration) -> Limits {
        Limits {
            timeout,
            ..self.clone()
        }
    }
}

/// The request line and headers, in bytes as they came (pure).
pub fn head_bytes(req: &Request) -> usize {
    // The request target as sent: origin form on the API, so its path and
    // query (no allocation on the hot path).
    let target = req.uri().path_and_query().map_or(1, |p| p.as_str().len());
    let line = req.method().as_str().len() + target + 12;
    req.headers()
        .iter()
        .map(|(k, v)| k.as_str().len() + v.len() + 4)
        .sum::<usize>()
        + line
}

/// The middleware: `from_fn_with_state(limits, enforce)`.
pub async fn enforce(State(limits): State<Limits>, req: Request, next: Next) -> Response {
    let Ok(_slot) = limits.slots.clone().try_acquire_owned() else {
        let mut r = reject(
            StatusCode::SERVICE_UNAVAILABLE,
            "OVERLOADED",
            format!(
                "{} requests are in flight, this daemon's [http] max_concurrent; retry shortly",
                limits.max_concurrent
            ),
        );
        r.headers_mut()
            .insert(header::RETRY_AFTER, HeaderValue::from_static("1"));
        return refuse_unread(req.into_body(), r).await;
    };
    let head = head_bytes(&req);
    if head > limits.max_header_bytes {
        let refusal = reject(
            StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE,
            "HEADERS_TOO_LARGE",
            format!(
                "the request line and headers are {head} bytes; this daemon takes at most {} ([http] max_header_bytes)",
                limits.max_header_bytes
            ),
        );
        return refuse_unread(req.into_body(), refusal).await;
    }
    match tokio::time::timeout(limits.timeout, next.run(req)).await {
        Ok(r) => r,
        Err(_) => reject(
            StatusCode::SERVICE_UNAVAILABLE,
            "TIMED_OUT",
            format!(
                "the request took longer than {:?} and was dropped; retry",
                limits.timeout
            ),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use axum::Router;
    use axum::body::Body;
    use axum::routing::get;
    use tower::ServiceExt;

    fn cfg(max_concurrent: usize, max_header_bytes: usize) -> HttpConfig {
        HttpConfig {
            max_concurrent,
            max_header_bytes,
            ..HttpConfig::default()
        }
    }

    fn app(limits: Limits, release: Arc<tokio::sync::Notify>) -> Router {
        Router::new()
            .route("/fast", get(|| async { "ok" }))
            .route(
                "/held",
                get(move || {
                    let release = release.clone();
                    async move {
                        release.notified().await;
                        "released"
                    }
                }),
            )
            .layer(axum::middleware::from_fn_with_state(limits, enforce))
    }

    fn get_req(path: &str) -> Request {
        Request::builder().uri(path).body(Body::empty()).unwrap()
    }

    #[tokio::test]
    async fn one_request_past_the_bound_is_503_with_retry_after_and_the_slot_comes_back() {
        let release = Arc::new(tokio::sync::Notify::new());
        let limits = Limits::new(&cfg(1, 16 * 1024), Duration::from_secs(5));
        let app = app(limits, release.clone());
        let held = tokio::spawn(app.clone().oneshot(get_req("/held")));
        // Until the held request has its slot, a second may still get one.
        let refused = loop {
            let r = app.clone().oneshot(get_req("/fast")).await.unwrap();
            if r.status() == StatusCode::SERVICE_UNAVAILABLE {
                break r;
            }
            tokio::task::yield_now().await;
        };
        assert_eq!(refused.headers()[header::RETRY_AFTER], "1");
        release.notify_one();
        assert_eq!(held.await.unwrap().unwrap().status(), StatusCode::OK);
        let again = app.oneshot(get_req("/fast")).await.unwrap();
        assert_eq!(again.status(), StatusCode::OK);
    }

    #[tokio::test]
    async fn headers_past_the_limit_are_431_and_a_slow_handler_times_out() {
        let release = Arc::new(tokio::sync::Notify::new());
        let limits = Limits::new(&cfg(8, 1024), Duration::from_millis(50));
        let app = app(limits, release);
        let big = Request::builder()
            .uri("/fast")
            .header("x-junk", "a".repeat(2048))
            .body(Body::empty())
            .unwrap();
        let r = app.clone().oneshot(big).await.unwrap();
        assert_eq!(r.status(), StatusCode::REQUEST_HEADER_FIELDS_TOO_LARGE);
        let r = app.clone().oneshot(get_req("/held")).await.unwrap();
        assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
        let body = axum::body::to_bytes(r.into_body(), 4096).await.unwrap();
        let e: serde_json::Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(e["error"], "TIMED_OUT");
        assert_eq!(e["retryable"], true);
        assert_eq!(
            app.oneshot(get_req("/fast")).await.unwrap().status(),
            StatusCode::OK
        );
    }
}
