//! Who this CLI acts as, and whether it may act at all (docs/security.md).
//!
//! Paths over the database URL are the root credential's: the bootstrap
//! (`db migrate`, `mq setup`, `auth token ...`) and the `--direct` break
//! glass. Their audit rows name the OS user, and the path they took.

use crate::exit::Refused;
use seckill_engine::{Actor, Config, Via};

/// The OS user running the CLI, for audit rows of database-URL paths.
pub fn os_user() -> String {
    ["USER", "LOGNAME"]
        .into_iter()
        .filter_map(|v| std::env::var(v).ok())
        .find(|u| !u.is_empty())
        .unwrap_or_else(|| "unknown".to_owned())
}

/// The actor of a bootstrap path (`db migrate`, `mq setup`, tokens).
pub fn bootstrap() -> Actor {
    Actor::database_url(&os_user(), Via::Bootstrap)
}

/// The actor of a `--direct` mutation: the break glass, audited as such.
pub fn direct() -> Actor {
    Actor::database_url(&os_user(), Via::Direct)
}

/// Refuses a mutation from a read-only CLI (`--readonly`, `[auth]
/// readonly`), before anything is touched.
pub fn writable(cfg: &Config, what: &str) -> Result<(), Refused> {
    if cfg.auth.readonly {
        Err(Refused(format!(
            "`{what}` changes state, and this CLI is read-only (--readonly or [auth] readonly = true)"
        )))
    } else {
        Ok(())
    }
}
