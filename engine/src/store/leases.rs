//! The singleton leases' table (docs/architecture.md §14.4): take or renew
//! a role's lease, give a daemon's leases back, and list who holds what.
//! Every expiry is judged on the database's clock, so daemons on hosts with
//! skewed clocks agree on who holds a role.

use crate::domain::singleton::Singleton;
use chrono::{DateTime, Utc};
use serde::Serialize;
use sqlx::PgPool;
use std::time::Duration;

/// A role's lease as the table holds it.
#[derive(Debug, Clone, Serialize)]
pub struct LeaseRow {
    pub role: Singleton,
    pub holder: String,
    pub acquired_at: DateTime<Utc>,
    pub renewed_at: DateTime<Utc>,
    pub expires_at: DateTime<Utc>,
    /// Not yet expired, on the database's clock.
    pub valid: bool,
    /// How long ago it expired (negative while it runs), on the database's
    /// clock: a lease given back a moment ago is a handover in progress.
    pub expired_ms: i64,
    pub handovers: i64,
}

/// Takes `role` for `holder` when it is free or expired, or renews it when
/// `holder` has it; true when `holder` holds it for `ttl` from now.
///
/// One statement: two daemons asking at once serialize on the row, and the
/// second sees the first's fresh lease and gets nothing.
pub async fn hold(
    pool: &PgPool,
    role: Singleton,
    holder: &str,
    ttl: Duration,
) -> Result<bool, sqlx::Error> {
    let row: Option<(String,)> = sqlx::query_as(
        "INSERT INTO singleton_leases (role, holder, expires_at)
         VALUES ($1, $2, now() + make_interval(secs => $3))
         ON CONFLICT (role) DO UPDATE SET
             holder = EXCLUDED.holder,
             acquired_at = CASE WHEN singleton_leases.holder = EXCLUDED.holder
                                THEN singleton_leases.acquired_at ELSE now() END,
             handovers = singleton_leases.handovers
                         + (singleton_leases.holder <> EXCLUDED.holder)::int,
             renewed_at = now(),
             expires_at = EXCLUDED.expires_at
         WHERE singleton_leases.holder = EXCLUDED.holder
            OR singleton_leases.expires_at < now()
         RETURNING holder",
    )
    .bind(role.as_str())
    .bind(holder)
    .bind(ttl.as_secs_f64())
    .fetch_optional(pool)
    .await?;
    Ok(row.is_some())
}

/// A clean stop: `holder`'s leases expire now, so another daemon takes
/// each role on its next try instead of after the TTL.
pub async fn release_all(pool: &PgPool, holder: &str) -> Result<u64, sqlx::Error> {
    let done = sqlx::query(
        "UPDATE singleton_leases SET expires_at = now() - interval '1 second'
         WHERE holder = $1 AND expires_at >= now()",
    )
    .bind(holder)
    .execute(pool)
    .await?;
    Ok(done.rows_affected())
}

/// Every role's lease, in role order; a role never taken has no row.
pub async fn list(pool: &PgPool) -> Result<Vec<LeaseRow>, sqlx::Error> {
    type Raw = (
        String,
        String,
        DateTime<Utc>,
        DateTime<Utc>,
        DateTime<Utc>,
        bool,
        i64,
        i64,
    );
    let rows: Vec<Raw> = sqlx::query_as(
        "SELECT role, holder, acquired_at, renewed_at, expires_at, expires_at >= now(),
                (extract(epoch FROM now() - expires_at) * 1000)::bigint, handovers
         FROM singleton_leases ORDER BY role",
    )
    .fetch_all(pool)
    .await?;
    // A role this version does not know (written by a newer daemon) is
    // left out rather than failing the whole list.
    Ok(rows
        .into_iter()
        .filter_map(
            |(role, holder, acquired_at, renewed_at, expires_at, valid, expired_ms, handovers)| {
                Some(LeaseRow {
                    role: Singleton::parse(&role)?,
                    holder,
                    acquired_at,
                    renewed_at,
                    expires_at,
                    valid,
                    expired_ms,
                    handovers,
                })
            },
        )
        .collect())
}
