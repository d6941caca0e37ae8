//! The daemon's gate (docs/security.md): every route but `/healthz`,
//! `/readyz` and `/metrics` needs a bearer token whose role grants what the
//! route needs. The tokens are read from `api_tokens` at start and every
//! `[auth] refresh_ms`, so a revoked token stops working within that; an
//! unknown token re-reads them at once (rate-limited), so a new one works
//! on its first call.
//!
//! A refusal is a 401 (no token, or one nobody issued) or a 403 (a token
//! whose role does not grant the route), with a JSON [`ApiError`] and one
//! log line naming the route and the token's name, never its secret.

use crate::config::AuthMode;
use crate::daemon::api::ApiError;
use crate::domain::auth::{self, Actor, Need, Role, Via};
use crate::store::tokens;
use axum::extract::{MatchedPath, Request, State};
use axum::http::StatusCode;
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};

/// The tokens this daemon accepts, by digest.
pub struct Gate {
    mode: AuthMode,
    tokens: RwLock<HashMap<String, (String, Role)>>,
    pool: Option<sqlx::PgPool>,
    /// When the set was last read. An unknown token re-reads it at once
    /// (a token issued a moment ago works on its first call, not after the
    /// next refresh), but at most once per [`MISS_REREAD`]: a flood of
    /// bogus tokens costs PostgreSQL a few reads a second, no more.
    read_at: tokio::sync::Mutex<Option<std::time::Instant>>,
}

/// The least time between two reads of `api_tokens`.
const MISS_REREAD: std::time::Duration = std::time::Duration::from_millis(250);

/// Why a request was refused.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Denied {
    /// No `Authorization: Bearer` header.
    Missing,
    /// A bearer token nobody issued, or one since revoked.
    Unknown,
    /// A known token whose role does not grant the route.
    Forbidden {
        name: String,
        role: Role,
        need: Need,
    },
}

impl Denied {
    pub fn status(&self) -> StatusCode {
        match self {
            Denied::Missing | Denied::Unknown => StatusCode::UNAUTHORIZED,
            Denied::Forbidden { .. } => StatusCode::FORBIDDEN,
        }
    }

    pub fn body(&self) -> ApiError {
        let (error, reason) = match self {
            Denied::Missing => (
                "UNAUTHENTICATED",
                "send Authorization: Bearer <token>; an admin issues one with `seckillctl auth token create`".to_owned(),
            ),
            Denied::Unknown => (
                "UNAUTHENTICATED",
                "this bearer token is unknown or revoked; `seckillctl auth token list` shows the live ones".to_owned(),
            ),
            Denied::Forbidden { name, role, need } => (
                "FORBIDDEN",
                format!(
                    "token {name:?} has role {role}; this route needs {}",
                    Role::least_for(*need)
                ),
            ),
        };
        ApiError {
            error: error.to_owned(),
            reason,
            retryable: false,
        }
    }
}

impl Gate {
    /// Reads the tokens once; the daemon refuses to start without them
    /// (a missing table is a schema the guard already names).
    pub async fn load(mode: AuthMode, pool: &sqlx::PgPool) -> Result<Arc<Gate>, sqlx::Error> {
        let gate = Arc::new(Gate {
            mode,
            tokens: RwLock::new(HashMap::new()),
            pool: Some(pool.clone()),
            read_at: tokio::sync::Mutex::new(None),
        });
        gate.refresh(pool).await?;
        Ok(gate)
    }

    /// Re-reads the set unless it was read within [`MISS_REREAD`]; callers
    /// queue behind one read rather than each running their own.
    async fn reread(&self) {
        let Some(pool) = &self.pool else { return };
        let mut read_at = self.read_at.lock().await;
        if read_at.is_some_and(|t| t.elapsed() < MISS_REREAD) {
            return;
        }
        if let Err(e) = self.refresh(pool).await {
            tracing::warn!(error = %e, "cannot re-read api_tokens; keeping the last set");
        }
        *read_at = Some(std::time::Instant::now());
    }

    pub async fn refresh(&self, pool: &sqlx::PgPool) -> Result<(), sqlx::Error> {
        let fresh: HashMap<String, (String, Role)> = tokens::active(pool)
            .await?
            .into_iter()
            .map(|t| (t.digest, (t.name, t.role)))
            .collect();
        *self.tokens.write().unwrap_or_else(|p| p.into_inner()) = fresh;
        Ok(())
    }

    /// Who the `Authorization` header says, and whether they may.
    pub fn check(&self, header: Option<&str>, need: Need) -> Result<Actor, Denied> {
        if self.mode == AuthMode::Open {
            return Ok(Actor {
                name: "anonymous".to_owned(),
                role: Role::Admin,
                via: Via::Open,
            });
        }
        let token = header.and_then(auth::bearer).ok_or(Denied::Missing)?;
        let digest = auth::token_digest(token);
        let tokens = self.tokens.read().unwrap_or_else(|p| p.into_inner());
        let (name, role) = tokens.get(&digest).ok_or(Denied::Unknown)?;
        decide(name, *role, need)
    }
}

/// Pure: a known token's name and role against what the route needs.
pub fn decide(name: &str, role: Role, need: Need) -> Result<Actor, Denied> {
    if role.grants(need) {
        Ok(Actor {
            name: name.to_owned(),
            role,
            via: Via::Token,
        })
    } else {
        Err(Denied::Forbidden {
            name: name.to_owned(),
            role,
            need,
        })
    }
}

/// The middleware: `route_layer(from_fn_with_state((gate, need), guard))`
/// on each group of routes. The [`Actor`] goes into the request's
/// extensions for the handlers that audit.
pub async fn guard(
    State((gate, need)): State<(Arc<Gate>, Need)>,
    mut req: Request,
    next: Next,
) -> Response {
    let header = req
        .headers()
        .get(axum::http::header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok());
    let mut checked = gate.check(header, need);
    if checked == Err(Denied::Unknown) {
        gate.reread().await;
        checked = gate.check(header, need);
    }
    match checked {
        Ok(actor) => {
            req.extensions_mut().insert(actor);
            next.run(req).await
        }
        Err(denied) => {
            let route = req
                .extensions()
                .get::<MatchedPath>()
                .map_or_else(|| req.uri().path().to_owned(), |p| p.as_str().to_owned());
            let token = match &denied {
                Denied::Forbidden { name, .. } => name.as_str(),
                Denied::Missing => "(none)",
                Denied::Unknown => "(unknown)",
            };
            tracing::warn!(
                method = %req.method(),
                route,
                token,
                status = denied.status().as_u16(),
                "refused: {}",
                denied.body().reason
            );
            let refusal = (denied.status(), axum::Json(denied.body())).into_response();
            crate::daemon::body::refuse_unread(req.into_body(), refusal).await
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_lower_role_is_forbidden_and_named() {
        let d = decide("ci-reader", Role::Reader, Need::Operate).unwrap_err();
        assert_eq!(d.status(), StatusCode::FORBIDDEN);
        let body = d.body();
        assert_eq!(body.error, "FORBIDDEN");
        assert!(body.reason.contains("ci-reader") && body.reason.contains("operator"));
        let a = decide("ops", Role::Operator, Need::Operate).unwrap();
        assert_eq!((a.name.as_str(), a.via), ("ops", Via::Token));
    }

    #[test]
    fn no_token_and_an_unknown_one_are_401() {
        let gate = Gate {
            mode: AuthMode::Token,
            tokens: RwLock::new(HashMap::from([(
                auth::token_digest("skt_good"),
                ("ops".to_owned(), Role::Operator),
            )])),
            pool: None,
            read_at: tokio::sync::Mutex::new(None),
        };
        assert_eq!(gate.check(None, Need::Read), Err(Denied::Missing));
        assert_eq!(
            gate.check(Some("Basic x"), Need::Read),
            Err(Denied::Missing)
        );
        assert_eq!(
            gate.check(Some("Bearer skt_bad"), Need::Read),
            Err(Denied::Unknown)
        );
        assert_eq!(Denied::Unknown.status(), StatusCode::UNAUTHORIZED);
        assert!(gate.check(Some("Bearer skt_good"), Need::Read).is_ok());
        assert!(matches!(
            gate.check(Some("Bearer skt_good"), Need::Administer),
            Err(Denied::Forbidden { .. })
        ));
    }

    #[test]
    fn open_mode_lets_anyone_in_and_says_so() {
        let gate = Gate {
            mode: AuthMode::Open,
            tokens: RwLock::new(HashMap::new()),
            pool: None,
            read_at: tokio::sync::Mutex::new(None),
        };
        let a = gate.check(None, Need::Administer).unwrap();
        assert_eq!(a.via, Via::Open);
    }
}
