//! The jobs exactly one engine daemon runs at a time (docs/architecture.md
//! §14.4): each is elected through a lease row in PostgreSQL, so N daemons
//! share the stack without N mirrors, N sweeps and N webhook posts.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Singleton {
    /// The DLQ mirror with its owner routing and verifier (§9.1, §9.2).
    DlqMirror,
    /// The cancel and compensation sweeps (§8).
    Sweeps,
    /// The ticket webhook's delivery (§9.2).
    Webhook,
}

impl Singleton {
    pub const ALL: [Singleton; 3] = [Singleton::DlqMirror, Singleton::Sweeps, Singleton::Webhook];

    /// The lease row's key, and the name on-call reads.
    pub fn as_str(self) -> &'static str {
        match self {
            Singleton::DlqMirror => "dlq-mirror",
            Singleton::Sweeps => "sweeps",
            Singleton::Webhook => "webhook",
        }
    }

    pub fn parse(s: &str) -> Option<Singleton> {
        Self::ALL.into_iter().find(|r| r.as_str() == s)
    }

    /// Roles as one cell: their names joined by `sep`, or `-` for none.
    pub fn cell(roles: &[Singleton], sep: &str) -> String {
        if roles.is_empty() {
            return "-".to_owned();
        }
        let names: Vec<&str> = roles.iter().map(|r| r.as_str()).collect();
        names.join(sep)
    }
}

impl std::fmt::Display for Singleton {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_match_serde() {
        for r in Singleton::ALL {
            assert_eq!(Singleton::parse(r.as_str()), Some(r));
            assert_eq!(serde_json::to_value(r).unwrap(), r.as_str());
        }
        assert_eq!(Singleton::parse("mirror"), None);
        assert_eq!(Singleton::cell(&[], ","), "-");
        assert_eq!(
            Singleton::cell(&[Singleton::DlqMirror, Singleton::Webhook], ", "),
            "dlq-mirror, webhook"
        );
    }
}
