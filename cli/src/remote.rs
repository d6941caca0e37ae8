//! The daemon's operator API, from the CLI's side (docs/security.md): every
//! mutation goes to a running engine with the CLI's token, so an operator
//! needs a token, not the database URL. `--direct` is the break glass: the
//! same library call over the database URL, audited as `direct`.

use crate::exit::{Refused, UsageError};
use seckill_engine::{ApiError, Config};
use serde::Serialize;
use serde::de::DeserializeOwned;

/// The engine could not be asked.
#[derive(Debug, thiserror::Error)]
#[error(
    "cannot reach the engine at {url} ({why}); start it (`seckillctl engine run`), point --engine-url at it, or break glass with --direct (over the database URL, audited)"
)]
pub struct EngineUnreachable {
    pub url: String,
    pub why: String,
}

/// An answer of the operator API: its status and JSON body.
pub struct Reply {
    pub status: u16,
    pub body: serde_json::Value,
}

impl Reply {
    /// The body as `T` (a 2xx, or a 409 that carries the state as it is).
    pub fn parse<T: DeserializeOwned>(&self) -> anyhow::Result<T> {
        Ok(serde_json::from_value(self.body.clone())?)
    }

    /// The API error of a 4xx, as the user's to fix (exit 64).
    pub fn usage(&self) -> anyhow::Error {
        match serde_json::from_value::<ApiError>(self.body.clone()) {
            Ok(e) => UsageError(e.reason).into(),
            Err(_) => UsageError(format!("the engine answered {}", self.status)).into(),
        }
    }

    pub fn reason(&self) -> String {
        self.body["reason"].as_str().map_or_else(
            || format!("the engine answered {}", self.status),
            str::to_owned,
        )
    }
}

/// POSTs `body` to the engine's `path` with the CLI's token. A 401 or 403
/// is refused (exit 77); a 5xx or no answer is the engine's to fix (exit 3).
pub async fn post<B: Serialize>(cfg: &Config, path: &str, body: &B) -> anyhow::Result<Reply> {
    let url = format!("{}{path}", cfg.engine_url);
    let unreachable = |why: String| EngineUnreachable {
        url: cfg.engine_url.clone(),
        why,
    };
    let resp = cfg
        .engine_http()
        .post(&url)
        .json(body)
        .send()
        .await
        .map_err(|e| unreachable(e.to_string()))?;
    let status = resp.status().as_u16();
    let body: serde_json::Value = resp.json().await.unwrap_or_default();
    let reply = Reply { status, body };
    match status {
        401 | 403 => Err(Refused(format!(
            "the engine refused this CLI ({status}): {}; set SECKILL_TOKEN (or [auth] token_file) to an operator token",
            reply.reason()
        ))
        .into()),
        500.. => Err(unreachable(format!("{status}: {}", reply.reason())).into()),
        _ => Ok(reply),
    }
}
