//! The daemon's operator API, from the CLI's side (docs/security.md): every
//! mutation goes to a running engine with the CLI's token, so an operator
//! needs a token, not the database URL. `--direct` is the break glass: the
//! same library call over the database URL, audited as `direct`. The client
//! itself is the engine's ([`seckill_engine::post_op`]); this maps its
//! answers to exit codes.

use crate::exit::{Refused, UsageError};
use seckill_engine::{ApiError, Config, OpError, OpReply};
use serde::Serialize;

/// The engine could not be asked (exit 3).
#[derive(Debug, thiserror::Error)]
#[error(
    "{0}; start it (`seckillctl engine run`), point --engine-url at it, or break glass with --direct (over the database URL, audited)"
)]
pub struct EngineUnreachable(OpError);

/// The API error of a 4xx, as the user's to fix (exit 64).
pub fn usage(reply: &OpReply) -> anyhow::Error {
    match reply.parse::<ApiError>() {
        Ok(e) => UsageError(e.reason).into(),
        Err(_) => UsageError(reply.reason()).into(),
    }
}

/// A 200's body as `T`; any other answer is the caller's input to fix
/// (exit 64), as the `--direct` path's refusals are.
pub fn answer<T: serde::de::DeserializeOwned>(reply: OpReply) -> anyhow::Result<T> {
    if reply.status != 200 {
        return Err(usage(&reply));
    }
    Ok(reply.parse()?)
}

/// POSTs `body` to the engine's `path` with the CLI's token. A 401 or 403
/// is refused (exit 77); a 5xx or no answer is the engine's to fix (exit 3).
pub async fn post<B: Serialize>(cfg: &Config, path: &str, body: &B) -> anyhow::Result<OpReply> {
    post_within(cfg, path, body, cfg.admin_timeout()).await
}

/// [`post`] for a call the engine holds on purpose (a replay's verify, a
/// restore's drain): waits up to `within`.
pub async fn post_within<B: Serialize>(
    cfg: &Config,
    path: &str,
    body: &B,
    within: std::time::Duration,
) -> anyhow::Result<OpReply> {
    seckill_engine::post_op_within(cfg, path, body, within)
        .await
        .map_err(|e| match e {
            e @ OpError::Refused { .. } => Refused(e.to_string()).into(),
            e @ OpError::Unreachable { .. } => EngineUnreachable(e).into(),
        })
}
