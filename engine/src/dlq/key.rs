//! The key of a mirrored dead message, `dlq_messages.message_id`
//! (docs/architecture.md §9.1).
//!
//! The broker's DLQ holds whatever reached a seckill topic, so the mirror
//! cannot assume the business `message_id` property is there or well
//! formed. It still mirrors and tickets every dead message (a dead message
//! nobody sees is the failure §9 exists to prevent): one without the
//! property is keyed `broker:<broker id>`, one with a malformed property
//! keeps it verbatim. Only a key that is a [`MessageId`] can be replayed: a
//! replay re-sends the *original* `message_id` (§9.4), and a foreign key
//! has none to keep.

use crate::domain::ids::MessageId;
use serde::{Deserialize, Serialize};
use sqlx::Postgres;
use sqlx::encode::IsNull;
use sqlx::error::BoxDynError;
use sqlx::postgres::{PgArgumentBuffer, PgTypeInfo, PgValueRef};
use std::convert::Infallible;
use std::fmt;
use std::str::FromStr;

/// How the mirror keyed a dead message. Stored and shown as one string,
/// exactly as before the type existed: the business id, `broker:<id>`, or
/// the malformed property as it came.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(from = "String", into = "String")]
pub enum DlqEntryKey {
    /// The business `message_id` (`evt_<ULID>`): the inbox key.
    Message(MessageId),
    /// No `message_id` property (`broker:<broker id>`), or one that is not
    /// `evt_<ULID>`: unvalidated input, kept as the broker gave it.
    Foreign(String),
}

/// Why a dead message cannot be replayed: its key is not a `message_id`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "{key} is not a message_id ({expected}), and a replay must keep the original one \
     (docs/architecture.md §9.4): a dead message mirrored without one can only be \
     inspected, with `seckillctl dlq show --message-id {key}`"
)]
pub struct NotReplayable {
    pub key: String,
    pub expected: &'static str,
}

impl DlqEntryKey {
    /// The key of a dead message without a `message_id` property.
    pub fn broker(broker_msg_id: &str) -> Self {
        DlqEntryKey::Foreign(format!("broker:{broker_msg_id}"))
    }

    pub fn as_str(&self) -> &str {
        match self {
            DlqEntryKey::Message(id) => id.as_str(),
            DlqEntryKey::Foreign(raw) => raw,
        }
    }

    pub fn message_id(&self) -> Option<&MessageId> {
        match self {
            DlqEntryKey::Message(id) => Some(id),
            DlqEntryKey::Foreign(_) => None,
        }
    }

    /// The `message_id` a replay would keep, or why there is none.
    pub fn replayable(&self) -> Result<&MessageId, NotReplayable> {
        self.message_id().ok_or_else(|| NotReplayable {
            key: self.as_str().to_owned(),
            expected: "evt_<ULID>",
        })
    }
}

impl From<MessageId> for DlqEntryKey {
    fn from(id: MessageId) -> Self {
        DlqEntryKey::Message(id)
    }
}

/// Infallible: whatever is not a `message_id` is a foreign key.
impl From<String> for DlqEntryKey {
    fn from(raw: String) -> Self {
        match MessageId::parse(&raw) {
            Ok(id) => DlqEntryKey::Message(id),
            Err(_) => DlqEntryKey::Foreign(raw),
        }
    }
}

impl From<DlqEntryKey> for String {
    fn from(key: DlqEntryKey) -> String {
        match key {
            DlqEntryKey::Message(id) => id.into(),
            DlqEntryKey::Foreign(raw) => raw,
        }
    }
}

impl FromStr for DlqEntryKey {
    type Err = Infallible;
    fn from_str(s: &str) -> Result<Self, Infallible> {
        Ok(s.to_owned().into())
    }
}

impl fmt::Display for DlqEntryKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

// A TEXT column, read and written as the string it has always been.
impl sqlx::Type<Postgres> for DlqEntryKey {
    fn type_info() -> PgTypeInfo {
        <String as sqlx::Type<Postgres>>::type_info()
    }

    fn compatible(ty: &PgTypeInfo) -> bool {
        <String as sqlx::Type<Postgres>>::compatible(ty)
    }
}

impl<'r> sqlx::Decode<'r, Postgres> for DlqEntryKey {
    fn decode(value: PgValueRef<'r>) -> Result<Self, BoxDynError> {
        Ok(<String as sqlx::Decode<'r, Postgres>>::decode(value)?.into())
    }
}

impl sqlx::Encode<'_, Postgres> for DlqEntryKey {
    fn encode_by_ref(&self, buf: &mut PgArgumentBuffer) -> Result<IsNull, BoxDynError> {
        <&str as sqlx::Encode<'_, Postgres>>::encode_by_ref(&self.as_str(), buf)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_key_round_trips_as_the_same_string() {
        let id = MessageId::generate();
        for raw in [id.as_str(), "broker:B1", "evt_1", ""] {
            let key: DlqEntryKey = raw.parse().unwrap();
            assert_eq!(key.as_str(), raw);
            assert_eq!(String::from(key.clone()), raw);
            assert_eq!(serde_json::to_string(&key).unwrap(), format!("{raw:?}"));
        }
        assert_eq!(DlqEntryKey::from(id.as_str().to_owned()), id.clone().into());
        assert_eq!(DlqEntryKey::broker("B1").as_str(), "broker:B1");
    }

    #[test]
    fn only_a_message_id_is_replayable_and_the_refusal_names_the_fix() {
        let id = MessageId::generate();
        assert_eq!(DlqEntryKey::from(id.clone()).replayable(), Ok(&id));
        let e = DlqEntryKey::broker("B1").replayable().unwrap_err();
        assert!(e.to_string().contains("evt_<ULID>"), "{e}");
        assert!(
            e.to_string().contains("dlq show --message-id broker:B1"),
            "{e}"
        );
    }
}
