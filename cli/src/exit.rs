//! Exit codes, chosen in one place (STYLE.md, Errors).

use seckill_engine::{ActivityError, DaemonError, DbError, RedisError};

/// Process exit codes. `health` uses 0, 1, 2 and 3 for ok, warn, critical and unreachable
/// (so cron can branch on them); other commands use the rest.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Exit {
    Ok = 0,
    Warn = 1,
    /// `health`: a docs/architecture.md §11.2 alert is critical.
    Critical = 2,
    Unreachable = 3,
    /// The schema is older (or newer) than this build.
    Schema = 4,
    /// `reconcile` found an invariant violated.
    Violation = 5,
    /// Bad input the user can fix: a flag, an id, a config file.
    Usage = 64,
    /// Refused for want of permission: no token, an unknown or revoked
    /// one, a role too low for the action (the daemon's 401 and 403), or a
    /// read-only CLI (docs/security.md). Sysexits' EX_NOPERM.
    NoPerm = 77,
    /// Anything else that went wrong.
    Failure = 70,
}

impl Exit {
    pub fn code(self) -> u8 {
        self as u8
    }

    /// Picks the exit code for an error chain from its typed root cause.
    pub fn for_error(err: &anyhow::Error) -> Exit {
        for cause in err.chain() {
            if let Some(e) = cause.downcast_ref::<DaemonError>() {
                return match e {
                    DaemonError::Db(e) => Self::for_db(e),
                    DaemonError::Redis(e) => Self::for_redis(e),
                    DaemonError::Mq(_) => Exit::Unreachable,
                    DaemonError::Http(_) => Exit::Failure,
                };
            }
            if let Some(e) = cause.downcast_ref::<DbError>() {
                return Self::for_db(e);
            }
            if let Some(e) = cause.downcast_ref::<RedisError>() {
                return Self::for_redis(e);
            }
            if let Some(e) = cause.downcast_ref::<ActivityError>() {
                return match e {
                    ActivityError::Db(_) | ActivityError::Redis(_) => Exit::Failure,
                    _ => Exit::Usage,
                };
            }
            if cause.downcast_ref::<UsageError>().is_some() {
                return Exit::Usage;
            }
            if cause.downcast_ref::<Refused>().is_some() {
                return Exit::NoPerm;
            }
            if cause
                .downcast_ref::<crate::remote::EngineUnreachable>()
                .is_some()
            {
                return Exit::Unreachable;
            }
        }
        Exit::Failure
    }

    fn for_db(e: &DbError) -> Exit {
        match e {
            DbError::Unreachable { .. } | DbError::MissingDatabase { .. } => Exit::Unreachable,
            DbError::SchemaMissing
            | DbError::SchemaBehind { .. }
            | DbError::SchemaAhead { .. }
            | DbError::SchemaDirty { .. }
            | DbError::ChecksumMismatch { .. } => Exit::Schema,
            DbError::BadUrl { .. } => Exit::Usage,
            _ => Exit::Failure,
        }
    }

    fn for_redis(e: &RedisError) -> Exit {
        match e {
            RedisError::Unreachable { .. } => Exit::Unreachable,
            RedisError::BadUrl { .. } => Exit::Usage,
            RedisError::Command(_) => Exit::Failure,
        }
    }
}

/// An error in what the user asked for, with the fix in its message.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

/// An action refused for want of permission (exit 77), with what to do.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);
