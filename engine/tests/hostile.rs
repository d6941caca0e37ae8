//! Hostile input, tried on purpose (docs/architecture.md §3.3): property
//! tests of every decoder the engine meets input through. Arbitrary bytes,
//! arbitrary JSON (unicode, deep nesting, huge fields, wrong types,
//! duplicate keys), and valid bodies with one field broken, all end in a
//! value or a clear error: never a panic. `PROPTEST_CASES` raises the case
//! count (CI runs the default of each block).

use chrono::{TimeZone, Utc};
use proptest::prelude::*;
use seckill_engine::message::{
    CancelOrderIfUnpaid, Message, MessageKind, OrderCreateRequested, OrderEvent,
    ReleaseReservation, TraceContext,
};
use seckill_engine::replay::{self, Check, Facts, Level, SchemaError};
use seckill_engine::{
    ActivityId, CompensationSource, CompensationStatus, DlqEntryKey, InboxStatus, MessageId,
    OrderId, OrderStatus, QuarantineReason, ReplayDecision, ReplayId, RequestId, ReservationId,
    ReserveBody, SkuId, TicketId, TopicKind, UserId,
};
use serde_json::{Map, Value, json};
use std::time::Duration;

const KINDS: [MessageKind; 4] = [
    MessageKind::OrderCreate,
    MessageKind::Cancel,
    MessageKind::OrderEvent,
    MessageKind::Release,
];

/// Any JSON value, up to a few levels deep, with unicode strings and
/// numbers of every shape.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(|n| json!(n)),
        any::<u64>().prop_map(|n| json!(n)),
        any::<f64>()
            .prop_filter("JSON has no NaN or infinity", |f| f.is_finite())
            .prop_map(|f| json!(f)),
        "\\PC{0,40}".prop_map(Value::String),
    ];
    leaf.prop_recursive(6, 64, 8, |inner| {
        prop_oneof![
            prop::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            prop::collection::btree_map("\\PC{0,12}", inner, 0..8)
                .prop_map(|m| Value::Object(m.into_iter().collect::<Map<_, _>>())),
        ]
    })
}

/// Nesting past serde_json's recursion limit (128): `[[[[...]]]]` or
/// `{"a":{"a":...}}`, closed or not.
fn deep_nesting() -> impl Strategy<Value = Vec<u8>> {
    (129usize..20_000, any::<bool>(), any::<bool>()).prop_map(|(depth, objects, closed)| {
        let (open, close) = if objects {
            ("{\"a\":", "}")
        } else {
            ("[", "]")
        };
        let mut s = open.repeat(depth);
        s.push('1');
        if closed {
            s.push_str(&close.repeat(depth));
        }
        s.into_bytes()
    })
}

fn at(ms: i64) -> chrono::DateTime<Utc> {
    Utc.timestamp_millis_opt(ms)
        .single()
        .unwrap_or_else(Utc::now)
}

/// A valid body of each kind, from a few random figures.
fn valid_body(kind: MessageKind, user: i64, ms: i64) -> Value {
    let rsv = ReservationId::generate();
    let order = OrderId::generate();
    let now = at(ms);
    match kind {
        MessageKind::OrderCreate => serde_json::to_value(OrderCreateRequested {
            schema_version: 1,
            event_type: "ORDER_CREATE_REQUESTED".into(),
            message_id: MessageId::generate(),
            message_key: rsv.clone(),
            request_id: RequestId::generate(),
            reservation_id: rsv,
            order_id: order,
            activity_id: ActivityId(1),
            sku_id: SkuId(1),
            user_id: UserId(user),
            quantity: 1,
            reservation_created_at: now,
            reservation_valid_until: now,
            created_at: now,
            retry_count: 0,
            replay_count: 0,
            producer: "proptest".into(),
            trace: TraceContext::generate(),
        }),
        MessageKind::Cancel => serde_json::to_value(CancelOrderIfUnpaid {
            schema_version: 1,
            event_type: "CANCEL_ORDER_IF_UNPAID".into(),
            message_id: MessageId::generate(),
            message_key: order.clone(),
            order_id: order,
            reservation_id: rsv,
            activity_id: ActivityId(1),
            sku_id: SkuId(1),
            user_id: UserId(user),
            deliver_at: now,
            created_at: now,
            retry_count: 0,
            replay_count: 0,
        }),
        MessageKind::OrderEvent => serde_json::to_value(OrderEvent {
            schema_version: 1,
            event_type: "ORDER_PAID".into(),
            message_id: MessageId::generate(),
            order_id: order,
            reservation_id: rsv,
            activity_id: ActivityId(1),
            sku_id: SkuId(1),
            user_id: UserId(user),
            status: OrderStatus::Paid,
            aggregate_version: 2,
            occurred_at: now,
        }),
        MessageKind::Release => serde_json::to_value(ReleaseReservation {
            schema_version: 1,
            event_type: "RELEASE_RESERVATION".into(),
            message_id: MessageId::generate(),
            reservation_id: rsv,
            activity_id: ActivityId(1),
            sku_id: SkuId(1),
            user_id: UserId(user),
            source: CompensationSource::ALL[0],
            reason: "proptest".into(),
            created_at: now,
        }),
    }
    .expect("a message serializes")
}

fn kind() -> impl Strategy<Value = MessageKind> {
    prop::sample::select(KINDS.to_vec())
}

/// What a decoder may answer: a message of the kind asked for, or a
/// reason from the quarantine vocabulary with a detail for people.
fn judged(kind: MessageKind, body: &[u8]) -> Result<(), TestCaseError> {
    match Message::parse(kind, body) {
        Ok(m) => prop_assert_eq!(m.kind(), kind),
        Err(e) => {
            prop_assert!(QuarantineReason::ALL.contains(&e.reason));
            prop_assert!(!e.detail.is_empty(), "a malformed body says why");
        }
    }
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    #[test]
    fn arbitrary_bytes_are_a_message_or_a_reason(kind in kind(), body in prop::collection::vec(any::<u8>(), 0..2048)) {
        judged(kind, &body)?;
    }

    #[test]
    fn arbitrary_json_is_a_message_or_a_reason(kind in kind(), v in json_value()) {
        judged(kind, &serde_json::to_vec(&v).unwrap())?;
    }

    #[test]
    fn deep_nesting_is_refused_as_bad_json(kind in kind(), body in deep_nesting()) {
        let e = Message::parse(kind, &body).unwrap_err();
        prop_assert_eq!(e.reason, QuarantineReason::BadJson);
    }

    #[test]
    fn a_valid_body_round_trips(kind in kind(), user in 1i64..i64::MAX, ms in 0i64..4_102_444_800_000) {
        let v = valid_body(kind, user, ms);
        let m = Message::parse(kind, &serde_json::to_vec(&v).unwrap());
        prop_assert!(m.is_ok(), "{v}: {m:?}");
    }

    /// One field of a valid body replaced by anything (a wrong type, a
    /// huge or unicode string, a nested value), removed, or joined by an
    /// unknown one: the answer is still a message or a reason, and a
    /// message that comes out keeps the decoder's rules.
    #[test]
    fn one_broken_field_is_caught_or_harmless(
        kind in kind(),
        pick in any::<prop::sample::Index>(),
        how in 0u8..4,
        garbage in json_value(),
        huge in 0usize..300_000,
    ) {
        let mut v = valid_body(kind, 7, 1_700_000_000_000);
        let obj = v.as_object_mut().unwrap();
        let keys: Vec<String> = obj.keys().cloned().collect();
        let key = pick.get(&keys).clone();
        match how {
            0 => { obj.insert(key.clone(), garbage); }
            1 => { obj.remove(&key); }
            2 => { obj.insert(key.clone(), Value::String("é".repeat(huge / 2))); }
            _ => { obj.insert(format!("{key}_extra"), garbage); }
        }
        let body = serde_json::to_vec(&v).unwrap();
        judged(kind, &body)?;
        if let Ok(Message::OrderCreate(m)) = Message::parse(kind, &body) {
            prop_assert_eq!(m.quantity, 1);
            prop_assert_eq!(&m.message_key, &m.reservation_id);
            prop_assert!(m.activity_id.0 > 0 && m.sku_id.0 > 0 && m.user_id.0 > 0);
        }
        if how == 1 && key == "schema_version" {
            prop_assert_eq!(Message::parse(kind, &body).unwrap_err().reason, QuarantineReason::MissingField);
        }
    }

    /// A key written twice, the first or the second copy garbage: the
    /// decoder answers, whichever copy it believes.
    #[test]
    fn duplicate_keys_are_answered(kind in kind(), pick in any::<prop::sample::Index>(), garbage in json_value(), first in any::<bool>()) {
        let v = valid_body(kind, 7, 1_700_000_000_000);
        let keys: Vec<String> = v.as_object().unwrap().keys().cloned().collect();
        let key = pick.get(&keys);
        let text = serde_json::to_string(&v).unwrap();
        let dup = format!("{}:{}", serde_json::to_string(key).unwrap(), garbage);
        let body = if first {
            format!("{{{dup},{}", &text[1..])
        } else {
            format!("{},{dup}}}", &text[..text.len() - 1])
        };
        judged(kind, body.as_bytes())?;
    }

    /// Every id newtype: any text parses or names what it expected; a
    /// generated id parses back to itself; a number is positive or refused.
    #[test]
    fn ids_parse_or_say_what_they_expected(s in "\\PC{0,64}", n in any::<i64>()) {
        for parsed in [
            MessageId::parse(&s).map(|i| i.to_string()),
            OrderId::parse(&s).map(|i| i.to_string()),
            ReservationId::parse(&s).map(|i| i.to_string()),
            RequestId::parse(&s).map(|i| i.to_string()),
            TicketId::parse(&s).map(|i| i.to_string()),
            ReplayId::parse(&s).map(|i| i.to_string()),
        ] {
            match parsed {
                Ok(back) => prop_assert_eq!(back, s.clone()),
                Err(e) => prop_assert!(e.to_string().contains("<ULID>")),
            }
        }
        for text in [s.clone(), n.to_string()] {
            for parsed in [
                text.parse::<ActivityId>().map(|i| i.0),
                text.parse::<SkuId>().map(|i| i.0),
                text.parse::<UserId>().map(|i| i.0),
            ] {
                match parsed {
                    Ok(v) => prop_assert!(v > 0 && v.to_string() == text),
                    Err(e) => prop_assert!(e.to_string().contains("positive integer")),
                }
            }
        }
        let key = DlqEntryKey::from(s.clone());
        prop_assert_eq!(key.replayable().is_ok(), MessageId::parse(&s).is_ok());
        prop_assert!(OrderId::parse(OrderId::generate().as_str()).is_ok());
    }

    /// The reservation body as the HTTP handler reads it: any JSON is a
    /// body or a serde error, never a panic.
    #[test]
    fn reservation_bodies_decode_or_refuse(v in json_value(), bytes in prop::collection::vec(any::<u8>(), 0..512)) {
        let _ = serde_json::from_value::<ReserveBody>(v);
        let _ = serde_json::from_slice::<ReserveBody>(&bytes);
    }
}

fn inbox() -> impl Strategy<Value = Option<(InboxStatus, Option<String>)>> {
    prop::option::of((
        prop::sample::select(InboxStatus::ALL.to_vec()),
        prop::option::of("\\PC{0,20}"),
    ))
}

prop_compose! {
    /// Any facts the pre-checks could be handed, sane or not: times
    /// anywhere in chrono's range (the inbox's retention mark too, or
    /// none), retention up to u64 seconds, every
    /// group and status, a body that parses or not.
    fn facts()(
        mirrored in any::<bool>(),
        dead_ms in any::<i64>(),
        retention_s in any::<u64>(),
        kind in prop::option::of(prop::sample::select(TopicKind::ALL.to_vec())),
        inbox in inbox(),
        order_status in prop::option::of(prop::sample::select(OrderStatus::ALL.to_vec())),
        compensation in prop::option::of((
            prop::sample::select(CompensationSource::ALL.to_vec()),
            prop::sample::select(CompensationStatus::ALL.to_vec()),
        )),
        ledger_rows in any::<i64>(),
        parses in any::<bool>(),
        valid_ms in prop::option::of(any::<i64>()),
        now_ms in any::<i64>(),
        horizon_ms in prop::option::of(any::<i64>()),
    ) -> Facts {
        let when = |ms: i64| Utc.timestamp_millis_opt(ms).single().unwrap_or(chrono::DateTime::<Utc>::MAX_UTC);
        Facts {
            mirrored,
            dead_at: when(dead_ms),
            retention: Duration::from_secs(retention_s),
            kind,
            inbox,
            order_status,
            compensation,
            ledger_rows,
            schema: if parses { Ok(()) } else { Err(SchemaError::NotSeckillGroup) },
            valid_until: valid_ms.map(when),
            now: when(now_ms),
            inbox_horizon: horizon_ms.map(when),
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(512))]

    /// The replay pre-checks of docs/architecture.md §9.3 over any facts:
    /// one verdict per check, `--force` turns only forceable blocks into
    /// warnings and says so, and a replay is sent only when nothing blocks.
    #[test]
    fn replay_prechecks_hold_their_rules(f in facts(), forced in prop::collection::vec(prop::sample::select(Check::ALL.to_vec()), 0..8), dry in any::<bool>()) {
        let plain = replay::verdicts(&f, &[]);
        let v = replay::verdicts(&f, &forced);
        prop_assert_eq!(v.len(), Check::ALL.len());
        for (p, w) in plain.iter().zip(&v) {
            prop_assert_eq!(p.check, w.check);
            prop_assert!(!w.evidence.is_empty());
            if w.forced {
                prop_assert!(p.level == Level::Block && w.level == Level::Warn);
                prop_assert!(p.check.forceable() && forced.contains(&p.check));
            } else {
                prop_assert_eq!(p.level, w.level);
            }
        }
        // inbox_kept (docs/architecture.md §16.2): blocks exactly a message
        // of a group with an inbox (or of no known group) that died less
        // than a day after the inbox's mark, and no --force lifts it.
        let kept = v.iter().find(|x| x.check == Check::InboxKept).map(|x| x.level);
        let may_be_gone = f.inbox_horizon.is_some_and(|h| {
            f.kind.is_none_or(|k| k.has_inbox())
                && h.checked_add_signed(chrono::Duration::days(1)).is_none_or(|l| f.dead_at < l)
        });
        prop_assert_eq!(kept == Some(Level::Block), may_be_gone);
        prop_assert_eq!(kept == Some(Level::Pass), !may_be_gone);
        let blocked = v.iter().any(|x| x.level == Level::Block);
        let decision = replay::decide(&v, dry);
        prop_assert_eq!(decision == ReplayDecision::Blocked, blocked);
        prop_assert_eq!(decision == ReplayDecision::DryRun, !blocked && dry);
    }

    /// The bulk replay's pacing never panics, whatever the rate, and never
    /// sends earlier than the one before.
    #[test]
    fn pacing_is_total_and_monotone(i in 0usize..1_000_000, rate in any::<f64>()) {
        let a = replay::pace(i, rate);
        let b = replay::pace(i + 1, rate);
        prop_assert!(b >= a);
    }
}
