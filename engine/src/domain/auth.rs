//! Who may do what (docs/security.md): roles, what a route needs, the actor
//! an audit row names, and the bearer token's shape. Pure: the token store
//! is `store::tokens`, the HTTP gate `daemon::auth`.

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use std::fmt;
use std::str::FromStr;

/// A token's role (docs/security.md, "Roles").
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    /// The public reservation and status routes.
    Ingress,
    /// Marks orders paid: it stands in for the payment provider's callback.
    Payments,
    /// `/v1/stats` and the operator reads.
    Reader,
    /// Everything that changes state, short of the admin's levers.
    Operator,
    /// Migrations, forced re-seeding, restores, stock changes, tokens.
    Admin,
}

/// What a route or a command needs; each role grants a fixed set
/// ([`Role::grants`], one table).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Need {
    /// Offer a reservation.
    Reserve,
    /// Read one reservation's or one order's status.
    Status,
    /// Mark an order paid.
    Pay,
    /// Read the engine's figures and the operator views.
    Read,
    /// Change state: replay, discard, ticket moves, cancel, rehearse.
    Operate,
    /// Re-seed, restore, change stock, migrate, manage tokens.
    Administer,
}

impl Role {
    pub const ALL: [Role; 5] = [
        Role::Ingress,
        Role::Payments,
        Role::Reader,
        Role::Operator,
        Role::Admin,
    ];

    /// The roles table of docs/security.md, in one place. The service
    /// roles (ingress, payments) see nothing of the operator surface, and
    /// an operator cannot mark an order paid: money is the payment
    /// provider's word, or an admin's.
    pub fn grants(self, need: Need) -> bool {
        use Need::*;
        match self {
            Role::Ingress => matches!(need, Reserve | Status),
            Role::Payments => matches!(need, Pay | Status),
            Role::Reader => matches!(need, Read | Status),
            Role::Operator => matches!(need, Read | Status | Operate),
            Role::Admin => true,
        }
    }

    /// The weakest role that grants `need`, for the "needs ..." of a 403.
    pub fn least_for(need: Need) -> Role {
        Role::ALL
            .into_iter()
            .find(|r| r.grants(need))
            .unwrap_or(Role::Admin)
    }

    pub fn as_str(self) -> &'static str {
        match self {
            Role::Ingress => "ingress",
            Role::Payments => "payments",
            Role::Reader => "reader",
            Role::Operator => "operator",
            Role::Admin => "admin",
        }
    }
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

#[derive(Debug, thiserror::Error, PartialEq, Eq)]
#[error("unknown role {0:?}: one of ingress, payments, reader, operator, admin")]
pub struct UnknownRole(pub String);

impl FromStr for Role {
    type Err = UnknownRole;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Role::ALL
            .into_iter()
            .find(|r| r.as_str() == s)
            .ok_or_else(|| UnknownRole(s.to_owned()))
    }
}

/// How an actor reached the system, kept on every audit row.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Via {
    /// A bearer token on the daemon's API.
    Token,
    /// The CLI's `--direct` break-glass path over the database URL.
    Direct,
    /// The database URL as the root credential: `db migrate`, `mq setup`,
    /// `auth token ...` (the only paths that need no token).
    Bootstrap,
    /// A daemon running `[auth] mode = "open"`: nobody was asked.
    Open,
}

impl Via {
    pub fn as_str(self) -> &'static str {
        match self {
            Via::Token => "token",
            Via::Direct => "direct",
            Via::Bootstrap => "bootstrap",
            Via::Open => "open",
        }
    }
}

/// Who did it: the name an audit row carries (a token's name, or the OS
/// user behind a database-URL path), the role it acted with, and how.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Actor {
    pub name: String,
    pub role: Role,
    pub via: Via,
}

impl Actor {
    /// Whoever holds the database URL: root (docs/security.md, "Bootstrap").
    pub fn database_url(user: &str, via: Via) -> Actor {
        Actor {
            name: format!("{user}@database-url"),
            role: Role::Admin,
            via,
        }
    }
}

/// A token name: lower-case letters, digits, `.`, `_` and `-`, at most 64
/// (the `api_tokens.name` check).
pub fn check_token_name(name: &str) -> Result<(), &'static str> {
    let mut chars = name.chars();
    let first_ok = chars
        .next()
        .is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    let rest_ok = chars
        .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '_' || c == '-');
    if first_ok && rest_ok && name.len() <= 64 {
        Ok(())
    } else {
        Err(
            "a token name is 1 to 64 of a-z, 0-9, '.', '_' and '-', starting with a letter or digit",
        )
    }
}

/// Every token starts with this, so a leaked one is recognisable in a
/// secret scanner's rules.
pub const TOKEN_PREFIX: &str = "skt_";

/// A new secret: the prefix and 256 random bits in hex.
pub fn new_token() -> String {
    let bits: [u8; 32] = rand::random();
    format!("{TOKEN_PREFIX}{}", hex(&bits))
}

/// What the store keeps instead of the secret. A plain SHA-256 suffices:
/// the secret carries 256 random bits, so there is nothing to brute-force
/// and no need for a slow password hash on the ingress hot path.
pub fn token_digest(token: &str) -> String {
    hex(&Sha256::digest(token.as_bytes()))
}

fn hex(bytes: &[u8]) -> String {
    use std::fmt::Write;
    bytes
        .iter()
        .fold(String::with_capacity(bytes.len() * 2), |mut s, b| {
            let _ = write!(s, "{b:02x}");
            s
        })
}

/// The token out of an `Authorization` header value, if it is a bearer one.
pub fn bearer(header: &str) -> Option<&str> {
    let (scheme, rest) = header.split_once(' ')?;
    let token = rest.trim();
    (scheme.eq_ignore_ascii_case("bearer") && !token.is_empty()).then_some(token)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_roles_table() {
        use Need::*;
        let needs = [Reserve, Status, Pay, Read, Operate, Administer];
        let table: Vec<(Role, Vec<Need>)> = Role::ALL
            .into_iter()
            .map(|r| (r, needs.into_iter().filter(|n| r.grants(*n)).collect()))
            .collect();
        assert_eq!(
            table,
            vec![
                (Role::Ingress, vec![Reserve, Status]),
                (Role::Payments, vec![Status, Pay]),
                (Role::Reader, vec![Status, Read]),
                (Role::Operator, vec![Status, Read, Operate]),
                (Role::Admin, needs.to_vec()),
            ]
        );
        assert_eq!(Role::least_for(Operate), Role::Operator);
        assert_eq!(Role::least_for(Administer), Role::Admin);
        assert_eq!(Role::least_for(Pay), Role::Payments);
    }

    #[test]
    fn roles_round_trip_and_unknown_ones_name_the_choices() {
        for r in Role::ALL {
            assert_eq!(r.as_str().parse::<Role>(), Ok(r));
        }
        let err = "root".parse::<Role>().unwrap_err().to_string();
        assert!(err.contains("operator"), "{err}");
    }

    #[test]
    fn tokens_are_random_and_only_their_digest_is_kept() {
        let a = new_token();
        let b = new_token();
        assert_ne!(a, b);
        assert!(a.starts_with(TOKEN_PREFIX) && a.len() == TOKEN_PREFIX.len() + 64);
        let d = token_digest(&a);
        assert_eq!(d.len(), 64);
        assert!(!d.contains(&a[TOKEN_PREFIX.len()..]));
        assert_eq!(d, token_digest(&a));
        // The known SHA-256 of "abc".
        assert_eq!(
            token_digest("abc"),
            "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad"
        );
    }

    #[test]
    fn bearer_headers() {
        assert_eq!(bearer("Bearer skt_x"), Some("skt_x"));
        assert_eq!(bearer("bearer   skt_x "), Some("skt_x"));
        assert_eq!(bearer("Basic dXNlcjpw"), None);
        assert_eq!(bearer("Bearer "), None);
        assert_eq!(bearer("skt_x"), None);
    }

    #[test]
    fn token_names() {
        assert!(check_token_name("bench-ingress.01").is_ok());
        assert!(check_token_name("").is_err());
        assert!(check_token_name("-x").is_err());
        assert!(check_token_name("Admin").is_err());
        assert!(check_token_name(&"a".repeat(65)).is_err());
    }
}
