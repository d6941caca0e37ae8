//! How the API reads a request body (docs/architecture.md §13.2, "Limits").
//!
//! A body is read whole, up to `[http] max_body_bytes`, before it is
//! judged; past the limit, or when a refusal comes before the body is read
//! (the gate's 401, a 431), what is left is read and dropped, up to
//! [`LINGER_BYTES`] and for at most [`LINGER`], in constant memory. The
//! reason: a socket closed with unread input is reset, and the reset can
//! destroy the refusal before the client reads it. The sale-under-fire test
//! (cli/tests/under_fire.rs) lost refusals that way, to a wrong content
//! type, to the gate, and to oversized bodies. Past the linger bounds the
//! connection closes (`Connection: close`), and a client still writing may
//! see it reset.
//!
//! Every refusal is the API's JSON error: 413 past the limit, 400 else.

use crate::daemon::state::{closing, reject};
use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};
use axum::response::Response;
use http_body_util::BodyExt;
use serde::de::DeserializeOwned;
use std::time::Duration;

/// The most of a refused body read and dropped so the refusal arrives.
pub const LINGER_BYTES: usize = 1024 * 1024;
/// The longest that takes.
pub const LINGER: Duration = Duration::from_secs(1);

/// `[http] max_body_bytes`, as the router hands it to the extractors.
#[derive(Debug, Clone, Copy)]
pub struct BodyCap(pub usize);

/// A JSON body of type `T`.
pub struct JsonBody<T>(pub T);

/// A JSON body of type `T`, or none at all (an empty body).
pub struct MaybeJsonBody<T>(pub Option<T>);

/// Reads and drops the rest of `body`, within [`LINGER_BYTES`] and
/// [`LINGER`]: true when it reached the end, so the connection is clean.
pub async fn discard(mut body: Body) -> bool {
    let rest = async {
        let mut seen = 0usize;
        loop {
            match body.frame().await {
                None => return true,
                Some(Err(_)) => return false,
                Some(Ok(frame)) => {
                    if let Some(data) = frame.data_ref() {
                        seen += data.len();
                        if seen > LINGER_BYTES {
                            return false;
                        }
                    }
                }
            }
        }
    };
    tokio::time::timeout(LINGER, rest).await.unwrap_or(false)
}

/// A refusal made before the body was read: the body dropped first, so the
/// refusal is not lost to a reset; `Connection: close` when it could not be.
pub async fn refuse_unread(body: Body, refusal: Response) -> Response {
    if discard(body).await {
        refusal
    } else {
        closing(refusal)
    }
}

fn is_json(req: &Request) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(str::trim)
        .is_some_and(|t| t == "application/json" || t.ends_with("+json"))
}

/// The body's bytes, read whole up to the cap, or refused.
async fn read(req: Request) -> Result<(bool, Bytes), Response> {
    let json = is_json(&req);
    let cap = req.extensions().get::<BodyCap>().map_or(64 * 1024, |c| c.0);
    let mut body = req.into_body();
    let mut buf = Vec::new();
    loop {
        match body.frame().await {
            None => return Ok((json, Bytes::from(buf))),
            Some(Err(e)) => {
                return Err(closing(reject(
                    StatusCode::BAD_REQUEST,
                    "BAD_BODY",
                    format!("the body could not be read: {e}"),
                )));
            }
            Some(Ok(frame)) => {
                let Some(data) = frame.data_ref() else {
                    continue;
                };
                if buf.len() + data.len() > cap {
                    let refusal = reject(
                        StatusCode::PAYLOAD_TOO_LARGE,
                        "BODY_TOO_LARGE",
                        format!(
                            "the body is larger than this daemon takes: {cap} bytes ([http] max_body_bytes)"
                        ),
                    );
                    return Err(refuse_unread(body, refusal).await);
                }
                buf.extend_from_slice(data);
            }
        }
    }
}

/// Parses a body already read whole (pure); the reason of a refusal.
fn parse<T: DeserializeOwned>(json: bool, bytes: &[u8]) -> Result<T, String> {
    if !json {
        return Err("send the body as JSON with Content-Type: application/json".into());
    }
    serde_json::from_slice(bytes)
        .map_err(|e| format!("the body is not the JSON this route takes: {e}"))
}

fn bad(reason: String) -> Response {
    reject(StatusCode::BAD_REQUEST, "BAD_BODY", reason)
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for JsonBody<T> {
    type Rejection = Response;

    async fn from_request(req: Request, _: &S) -> Result<Self, Response> {
        let (json, bytes) = read(req).await?;
        parse(json, &bytes).map(JsonBody).map_err(bad)
    }
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for MaybeJsonBody<T> {
    type Rejection = Response;

    async fn from_request(req: Request, _: &S) -> Result<Self, Response> {
        let (json, bytes) = read(req).await?;
        if bytes.is_empty() {
            return Ok(MaybeJsonBody(None));
        }
        parse(json, &bytes)
            .map(|v| MaybeJsonBody(Some(v)))
            .map_err(bad)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn a_body_within_the_linger_is_dropped_whole_and_a_larger_one_is_not() {
        assert!(discard(Body::from(vec![b'x'; LINGER_BYTES])).await);
        assert!(!discard(Body::from(vec![b'x'; LINGER_BYTES + 1])).await);
        assert!(discard(Body::empty()).await);
    }

    #[tokio::test]
    async fn past_the_cap_is_413_and_within_it_parses() {
        let req = |body: &str, cap: usize| {
            let mut r = Request::builder()
                .header(header::CONTENT_TYPE, "application/json")
                .body(Body::from(body.to_owned()))
                .unwrap();
            r.extensions_mut().insert(BodyCap(cap));
            r
        };
        let big = format!("{{\"a\": \"{}\"}}", "x".repeat(200));
        let refused = JsonBody::<serde_json::Value>::from_request(req(&big, 100), &())
            .await
            .err()
            .expect("refused");
        assert_eq!(refused.status(), StatusCode::PAYLOAD_TOO_LARGE);
        // Drained whole (well within the linger): the connection stays open.
        assert!(refused.headers().get(header::CONNECTION).is_none());
        let ok = JsonBody::<serde_json::Value>::from_request(req(&big, 1000), &()).await;
        assert!(ok.is_ok());
    }
}
