//! How the API reads a JSON body (docs/architecture.md §13.2, "Limits"):
//! always whole (up to `[http] max_body_bytes`) before it is judged, so a
//! refusal never leaves unread bytes in a keep-alive connection. Closing a
//! socket with unread input makes TCP reset it, and the reset can destroy
//! the refusal before the client reads it; the sale-under-fire test
//! (cli/tests/under_fire.rs) lost requests that way when a wrong content
//! type was refused before the body was read.
//!
//! Every refusal is the API's JSON error: 413 past the limit (the read
//! stopped there, so the connection closes), 400 for anything else.

use crate::daemon::state::{closing, reject};
use axum::body::Bytes;
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};
use axum::response::Response;
use serde::de::DeserializeOwned;

/// A JSON body of type `T`.
pub struct JsonBody<T>(pub T);

/// A JSON body of type `T`, or none at all (an empty body).
pub struct MaybeJsonBody<T>(pub Option<T>);

fn is_json(req: &Request) -> bool {
    req.headers()
        .get(header::CONTENT_TYPE)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.split(';').next())
        .map(str::trim)
        .is_some_and(|t| t == "application/json" || t.ends_with("+json"))
}

/// The body's bytes, read whole or refused.
async fn read<S: Send + Sync>(req: Request, state: &S) -> Result<(bool, Bytes), Response> {
    let json = is_json(&req);
    match Bytes::from_request(req, state).await {
        Ok(bytes) => Ok((json, bytes)),
        Err(e) if e.status() == StatusCode::PAYLOAD_TOO_LARGE => Err(closing(reject(
            StatusCode::PAYLOAD_TOO_LARGE,
            "BODY_TOO_LARGE",
            "the body is larger than this daemon takes ([http] max_body_bytes)",
        ))),
        Err(e) => Err(closing(reject(
            StatusCode::BAD_REQUEST,
            "BAD_BODY",
            e.body_text(),
        ))),
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

    async fn from_request(req: Request, state: &S) -> Result<Self, Response> {
        let (json, bytes) = read(req, state).await?;
        parse(json, &bytes).map(JsonBody).map_err(bad)
    }
}

impl<S: Send + Sync, T: DeserializeOwned> FromRequest<S> for MaybeJsonBody<T> {
    type Rejection = Response;

    async fn from_request(req: Request, state: &S) -> Result<Self, Response> {
        let (json, bytes) = read(req, state).await?;
        if bytes.is_empty() {
            return Ok(MaybeJsonBody(None));
        }
        parse(json, &bytes)
            .map(|v| MaybeJsonBody(Some(v)))
            .map_err(bad)
    }
}
