//! PostgreSQL: the pool, the embedded migrations and the schema guard.
//!
//! Inputs: [`Config`]. Outputs: a [`PgPool`] that is only handed out once the
//! schema is exactly what this build expects (docs/architecture.md §5: the CLI and the
//! daemon refuse to run against an older schema).

use crate::config::Config;
use secrecy::ExposeSecret;
use serde::Serialize;
pub use sqlx::PgPool;
use sqlx::Row;
use sqlx::migrate::Migrator;
use sqlx::postgres::{PgConnectOptions, PgPoolOptions};
use std::collections::BTreeMap;
use std::str::FromStr;
use std::time::Duration;

pub static MIGRATOR: Migrator = sqlx::migrate!("../migrations");

#[derive(Debug, thiserror::Error)]
pub enum DbError {
    #[error("invalid database URL {url}: {source}")]
    BadUrl { url: String, source: sqlx::Error },
    #[error(
        "database {database:?} does not exist at {url}; create it with `./scripts/stack.sh up` (or `createdb {database}`)"
    )]
    MissingDatabase { url: String, database: String },
    #[error(
        "cannot reach PostgreSQL at {url}: {source}; is the stack up? (`./scripts/stack.sh up`)"
    )]
    Unreachable { url: String, source: sqlx::Error },
    #[error("the database schema has no migrations applied; run `seckillctl db migrate`")]
    SchemaMissing,
    #[error("the database schema is behind this build: {} migration(s) pending ({}); run `seckillctl db migrate`", pending.len(), pending.join(", "))]
    SchemaBehind { pending: Vec<String> },
    #[error(
        "migration {version} failed part-way in an earlier run; fix it by hand, then run `seckillctl db migrate`"
    )]
    SchemaDirty { version: i64 },
    #[error(
        "the database has migration(s) {unknown:?} that this build does not know; upgrade seckillctl"
    )]
    SchemaAhead { unknown: Vec<i64> },
    #[error(
        "migration {version} was changed after it was applied (checksum mismatch); migrations are append-only"
    )]
    ChecksumMismatch { version: i64 },
    #[error("migration failed: {0}")]
    Migrate(#[from] sqlx::migrate::MigrateError),
    #[error(transparent)]
    Sql(#[from] sqlx::Error),
}

/// One migration as seen from both sides.
#[derive(Debug, Clone, Serialize)]
pub struct MigrationRow {
    pub version: i64,
    pub description: String,
    pub state: MigrationState,
    pub applied_at: Option<chrono::DateTime<chrono::Utc>>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum MigrationState {
    Applied,
    Pending,
    /// Started but not finished in an earlier run.
    Failed,
    /// Applied, but the file differs from what was applied.
    Changed,
    /// Applied, but this build does not ship it.
    Unknown,
}

/// What the database holds, per version: (success, checksum).
pub type Applied = BTreeMap<i64, (bool, Vec<u8>, chrono::DateTime<chrono::Utc>)>;

/// Pure: compares the migrations this build ships with what was applied.
pub fn compare(known: &[(i64, String, Vec<u8>)], applied: &Applied) -> Vec<MigrationRow> {
    let mut rows: Vec<MigrationRow> = known
        .iter()
        .map(|(version, description, checksum)| {
            let (state, applied_at) = match applied.get(version) {
                None => (MigrationState::Pending, None),
                Some((false, _, at)) => (MigrationState::Failed, Some(*at)),
                Some((true, sum, at)) if sum != checksum => (MigrationState::Changed, Some(*at)),
                Some((true, _, at)) => (MigrationState::Applied, Some(*at)),
            };
            MigrationRow {
                version: *version,
                description: description.clone(),
                state,
                applied_at,
            }
        })
        .collect();
    for (version, (_, _, at)) in applied {
        if !known.iter().any(|(v, _, _)| v == version) {
            rows.push(MigrationRow {
                version: *version,
                description: String::new(),
                state: MigrationState::Unknown,
                applied_at: Some(*at),
            });
        }
    }
    rows.sort_by_key(|r| r.version);
    rows
}

/// Pure: the verdict of the schema guard over [`compare`]'s rows.
pub fn verdict(rows: &[MigrationRow]) -> Result<(), DbError> {
    if let Some(r) = rows.iter().find(|r| r.state == MigrationState::Failed) {
        return Err(DbError::SchemaDirty { version: r.version });
    }
    if let Some(r) = rows.iter().find(|r| r.state == MigrationState::Changed) {
        return Err(DbError::ChecksumMismatch { version: r.version });
    }
    let unknown: Vec<i64> = rows
        .iter()
        .filter(|r| r.state == MigrationState::Unknown)
        .map(|r| r.version)
        .collect();
    if !unknown.is_empty() {
        return Err(DbError::SchemaAhead { unknown });
    }
    let pending: Vec<&MigrationRow> = rows
        .iter()
        .filter(|r| r.state == MigrationState::Pending)
        .collect();
    if !pending.is_empty() && pending.len() == rows.len() {
        return Err(DbError::SchemaMissing);
    }
    if !pending.is_empty() {
        return Err(DbError::SchemaBehind {
            pending: pending
                .iter()
                .map(|r| format!("{} {}", r.version, r.description))
                .collect(),
        });
    }
    Ok(())
}

/// The pool's size, idle connections and maximum, for `/v1/stats`.
pub fn pool_view(pool: &PgPool) -> crate::domain::stats::PoolView {
    crate::domain::stats::PoolView {
        size: pool.size(),
        idle: pool.num_idle() as u32,
        max: pool.options().get_max_connections(),
    }
}

/// Opens a pool without any schema check: for `db migrate` and `db status`.
pub async fn connect_unchecked(cfg: &Config) -> Result<PgPool, DbError> {
    let url = cfg.database_url_redacted();
    let opts = PgConnectOptions::from_str(cfg.database_url.expose_secret())
        .map_err(|source| DbError::BadUrl {
            url: url.clone(),
            source,
        })?
        .application_name("seckillctl");
    let database = opts.get_database().unwrap_or("postgres").to_owned();
    let pool = PgPoolOptions::new()
        .max_connections(cfg.pg.max_connections)
        .acquire_timeout(Duration::from_millis(cfg.pg.acquire_timeout_ms))
        .connect_with(opts)
        .await
        .map_err(|source| match &source {
            sqlx::Error::Database(e) if e.code().as_deref() == Some("3D000") => {
                DbError::MissingDatabase {
                    url: url.clone(),
                    database: database.clone(),
                }
            }
            _ => DbError::Unreachable {
                url: url.clone(),
                source,
            },
        })?;
    Ok(pool)
}

/// Opens a pool and refuses to hand it out unless the schema is current.
pub async fn connect(cfg: &Config) -> Result<PgPool, DbError> {
    let pool = connect_unchecked(cfg).await?;
    verdict(&status(&pool).await?)?;
    Ok(pool)
}

fn known_migrations() -> Vec<(i64, String, Vec<u8>)> {
    MIGRATOR
        .iter()
        .filter(|m| m.migration_type.is_up_migration())
        .map(|m| (m.version, m.description.to_string(), m.checksum.to_vec()))
        .collect()
}

/// Every known and applied migration with its state.
pub async fn status(pool: &PgPool) -> Result<Vec<MigrationRow>, DbError> {
    let table_exists: bool =
        sqlx::query_scalar("SELECT to_regclass('public._sqlx_migrations') IS NOT NULL")
            .fetch_one(pool)
            .await?;
    let mut applied = Applied::new();
    if table_exists {
        let rows = sqlx::query(
            "SELECT version, success, checksum, installed_on FROM _sqlx_migrations ORDER BY version",
        )
        .fetch_all(pool)
        .await?;
        for row in rows {
            applied.insert(
                row.try_get("version")?,
                (
                    row.try_get("success")?,
                    row.try_get("checksum")?,
                    row.try_get("installed_on")?,
                ),
            );
        }
    }
    Ok(compare(&known_migrations(), &applied))
}

/// Applies every pending migration; returns the versions it applied.
pub async fn migrate(pool: &PgPool) -> Result<Vec<MigrationRow>, DbError> {
    let before = status(pool).await?;
    MIGRATOR.run(pool).await?;
    let after = status(pool).await?;
    Ok(after
        .into_iter()
        .filter(|r| {
            r.state == MigrationState::Applied
                && before
                    .iter()
                    .any(|b| b.version == r.version && b.state == MigrationState::Pending)
        })
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn at() -> chrono::DateTime<chrono::Utc> {
        chrono::Utc::now()
    }

    fn known() -> Vec<(i64, String, Vec<u8>)> {
        vec![
            (1, "core".into(), vec![1]),
            (2, "messaging".into(), vec![2]),
        ]
    }

    #[test]
    fn nothing_applied_is_missing() {
        let rows = compare(&known(), &Applied::new());
        assert!(matches!(verdict(&rows), Err(DbError::SchemaMissing)));
    }

    #[test]
    fn older_schema_names_the_fix() {
        let applied = Applied::from([(1, (true, vec![1], at()))]);
        let err = verdict(&compare(&known(), &applied)).unwrap_err();
        assert!(matches!(err, DbError::SchemaBehind { .. }));
        assert!(err.to_string().contains("seckillctl db migrate"), "{err}");
        assert!(err.to_string().contains("2 messaging"), "{err}");
    }

    #[test]
    fn current_schema_passes() {
        let applied = Applied::from([(1, (true, vec![1], at())), (2, (true, vec![2], at()))]);
        assert!(verdict(&compare(&known(), &applied)).is_ok());
    }

    #[test]
    fn dirty_changed_and_unknown_are_refused() {
        let dirty = Applied::from([(1, (false, vec![1], at()))]);
        assert!(matches!(
            verdict(&compare(&known(), &dirty)),
            Err(DbError::SchemaDirty { version: 1 })
        ));
        let changed = Applied::from([(1, (true, vec![9], at())), (2, (true, vec![2], at()))]);
        assert!(matches!(
            verdict(&compare(&known(), &changed)),
            Err(DbError::ChecksumMismatch { version: 1 })
        ));
        let ahead = Applied::from([
            (1, (true, vec![1], at())),
            (2, (true, vec![2], at())),
            (3, (true, vec![3], at())),
        ]);
        assert!(matches!(
            verdict(&compare(&known(), &ahead)),
            Err(DbError::SchemaAhead { .. })
        ));
    }

    #[test]
    fn the_build_ships_its_migrations() {
        assert!(known_migrations().len() >= 3);
    }
}
