//! The send-outcome classifier (docs/architecture.md §6): a pure function over the
//! client's error. It decides whether a reservation may be compensated, so
//! the bias is fixed: anything that might have been stored is UNKNOWN, and
//! UNKNOWN never compensates; it stays pending and is re-sent with the same
//! `message_id`, which the consumer inbox absorbs.

use rocketmq_client_rust::{ClientError, MQClientException};
use rocketmq_error::ErrorClass;
use serde::Serialize;

/// What a failed send means for the reservation behind it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum FailureKind {
    /// The broker may have stored it. Re-send the same `message_id` later.
    Unknown(UnknownCause),
    /// Certainly not stored, and re-sending the same message cannot succeed:
    /// mark SEND_FAILED, alert and compensate.
    Definite(DefiniteCause),
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum UnknownCause {
    /// A deadline passed after the request may have been written.
    Timeout,
    /// The connection broke while writing or awaiting the response.
    ConnectionLost,
    /// Not stored, but a re-send may succeed: broker busy or not serving,
    /// a connection that failed before writing, local back-pressure, a
    /// producer not yet started.
    NotSentTransient,
    /// No route to the topic right now. During a broker outage the
    /// NameServer drops its routes; compensating then would turn an outage
    /// into mass rejections, so the scanner keeps trying until `valid_until`.
    NoRoute,
    /// Stored on the broker without the durability asked for (flush or
    /// replica timeout). Re-sending is safe and closes the loss window.
    NotDurable,
    /// An error this classifier does not know: treat it as possibly stored.
    Unrecognized,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "SCREAMING_SNAKE_CASE")]
pub enum DefiniteCause {
    /// Response code 13: the message itself is illegal (size, properties).
    MessageIllegal,
    /// Response code 16.
    NoPermission,
    /// Response code 17: the broker says the topic does not exist.
    TopicNotExist,
    /// Client-side validation or configuration refused to send it.
    InvalidArgument,
}

const MESSAGE_ILLEGAL: i32 = 13;
const NO_PERMISSION: i32 = 16;
const TOPIC_NOT_EXIST: i32 = 17;
const SYSTEM_ERROR: i32 = 1;
const SYSTEM_BUSY: i32 = 2;
const SERVICE_NOT_AVAILABLE: i32 = 14;
const BROKER_NOT_EXIST: i32 = 10003;
const NO_NAME_SERVER: i32 = 10004;
const NOT_FOUND_TOPIC: i32 = 10005;

fn definite_code(code: i32) -> Option<DefiniteCause> {
    match code {
        MESSAGE_ILLEGAL => Some(DefiniteCause::MessageIllegal),
        NO_PERMISSION => Some(DefiniteCause::NoPermission),
        TOPIC_NOT_EXIST => Some(DefiniteCause::TopicNotExist),
        _ => None,
    }
}

/// Where a transport error happened: before anything was written, or after.
fn phase(e: &ClientError) -> Option<String> {
    let view = e.diagnostic_view().ok()?;
    view.fields()
        .find(|f| f.name() == "phase")
        .and_then(|f| match f.value() {
            rocketmq_error::ViewValueRef::Text(t) => Some(t.to_string()),
            _ => None,
        })
}

/// Classifies a failed send. Every error class of ROCKETMQ.md has a unit test.
pub fn classify(e: &ClientError) -> FailureKind {
    use FailureKind::{Definite, Unknown};

    if e.is(&rocketmq_error::BROKER_OPERATION_FAILED) {
        // The broker answered no, so nothing was stored by this request; and
        // the client never retries a send that may have been written, so no
        // earlier attempt was stored either (ROCKETMQ.md, Producer).
        return match e.broker_response_code() {
            Some(code) => match definite_code(code) {
                Some(cause) => Definite(cause),
                None if matches!(code, SYSTEM_ERROR | SYSTEM_BUSY | SERVICE_NOT_AVAILABLE) => {
                    Unknown(UnknownCause::NotSentTransient)
                }
                None => Unknown(UnknownCause::Unrecognized),
            },
            None => Unknown(UnknownCause::Unrecognized),
        };
    }
    if e.is(&rocketmq_error::CORE_ARGUMENT_INVALID) {
        // Overloaded: client validation (code 13), no route (10003/10005),
        // and a producer that was never started (-1).
        let code = e
            .source_ref::<MQClientException>()
            .map(|x| x.response_code());
        return match code {
            Some(c) if definite_code(c).is_some() => {
                Definite(definite_code(c).unwrap_or(DefiniteCause::InvalidArgument))
            }
            Some(BROKER_NOT_EXIST | NO_NAME_SERVER | NOT_FOUND_TOPIC) => {
                Unknown(UnknownCause::NoRoute)
            }
            Some(-1) => Unknown(UnknownCause::NotSentTransient),
            _ => Definite(DefiniteCause::InvalidArgument),
        };
    }
    if e.is(&rocketmq_error::ROUTE_TOPIC_NOT_FOUND) {
        return Unknown(UnknownCause::NoRoute);
    }
    if e.is(&rocketmq_error::PROTOCOL_MESSAGE_PROPERTY_INVALID) {
        return Definite(DefiniteCause::MessageIllegal);
    }
    if e.is(&rocketmq_error::CLIENT_LIFECYCLE_NOT_STARTED)
        || e.is(&rocketmq_error::CLIENT_LIFECYCLE_SHUTTING_DOWN)
        || e.is(&rocketmq_error::TRANSPORT_ADMISSION_QUEUE_SATURATED)
        || e.is(&rocketmq_error::TRANSPORT_REMOTE_RATE_LIMITED)
        || e.is(&rocketmq_error::TRANSPORT_DNS_FAILED)
        || e.is(&rocketmq_error::TRANSPORT_CONNECTION_TIMEOUT)
    {
        return Unknown(UnknownCause::NotSentTransient);
    }
    if e.is(&rocketmq_error::TRANSPORT_CONNECTION_FAILED)
        || e.is(&rocketmq_error::TRANSPORT_SESSION_FAILED)
    {
        return match phase(e).as_deref() {
            Some("connect" | "before_write") => Unknown(UnknownCause::NotSentTransient),
            _ => Unknown(UnknownCause::ConnectionLost),
        };
    }
    if e.class() == ErrorClass::TIMEOUT {
        return Unknown(UnknownCause::Timeout);
    }
    Unknown(UnknownCause::Unrecognized)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rocketmq_error::{Error, ErrorContext, fields};

    fn of(d: &'static rocketmq_error::ErrorDescriptor) -> ClientError {
        ClientError::from_error(Error::new(d))
    }

    fn with_phase(d: &'static rocketmq_error::ErrorDescriptor, p: &str) -> ClientError {
        ClientError::from_error(
            Error::new(d).with_context(ErrorContext::new().with_text(fields::PHASE, p)),
        )
    }

    #[test]
    fn broker_refusals_13_16_17_are_definite() {
        for (code, cause) in [
            (13, DefiniteCause::MessageIllegal),
            (16, DefiniteCause::NoPermission),
            (17, DefiniteCause::TopicNotExist),
        ] {
            let e = ClientError::broker_operation_failed("send", code, "no");
            assert_eq!(classify(&e), FailureKind::Definite(cause), "code {code}");
        }
    }

    #[test]
    fn broker_transient_refusals_are_retried_not_compensated() {
        for code in [1, 2, 14] {
            let e = ClientError::broker_operation_failed("send", code, "busy");
            assert_eq!(
                classify(&e),
                FailureKind::Unknown(UnknownCause::NotSentTransient),
                "code {code}"
            );
        }
        let e = ClientError::broker_operation_failed("send", 999, "?");
        assert_eq!(
            classify(&e),
            FailureKind::Unknown(UnknownCause::Unrecognized)
        );
    }

    #[test]
    fn timeouts_are_unknown() {
        for d in [
            &rocketmq_error::CORE_OPERATION_TIMED_OUT,
            &rocketmq_error::TRANSPORT_RESPONSE_TIMEOUT,
            &rocketmq_error::TRANSPORT_WRITE_TIMEOUT,
        ] {
            assert_eq!(
                classify(&of(d)),
                FailureKind::Unknown(UnknownCause::Timeout),
                "{}",
                d.code().as_str()
            );
        }
        assert_eq!(
            classify(&ClientError::timeout("send", 30)),
            FailureKind::Unknown(UnknownCause::Timeout)
        );
    }

    #[test]
    fn connection_failures_depend_on_the_phase() {
        let d = &rocketmq_error::TRANSPORT_CONNECTION_FAILED;
        for (phase, want) in [
            ("connect", UnknownCause::NotSentTransient),
            ("before_write", UnknownCause::NotSentTransient),
            ("writing", UnknownCause::ConnectionLost),
            ("awaiting_response", UnknownCause::ConnectionLost),
        ] {
            assert_eq!(
                classify(&with_phase(d, phase)),
                FailureKind::Unknown(want),
                "{phase}"
            );
        }
        // No phase: it may have been written.
        assert_eq!(
            classify(&of(d)),
            FailureKind::Unknown(UnknownCause::ConnectionLost)
        );
        // A session failure carries no phase in this client: always possibly written.
        assert_eq!(
            classify(&of(&rocketmq_error::TRANSPORT_SESSION_FAILED)),
            FailureKind::Unknown(UnknownCause::ConnectionLost)
        );
    }

    #[test]
    fn local_refusals_are_not_sent() {
        for d in [
            &rocketmq_error::CLIENT_LIFECYCLE_NOT_STARTED,
            &rocketmq_error::CLIENT_LIFECYCLE_SHUTTING_DOWN,
            &rocketmq_error::TRANSPORT_ADMISSION_QUEUE_SATURATED,
            &rocketmq_error::TRANSPORT_REMOTE_RATE_LIMITED,
            &rocketmq_error::TRANSPORT_DNS_FAILED,
            &rocketmq_error::TRANSPORT_CONNECTION_TIMEOUT,
        ] {
            assert_eq!(
                classify(&of(d)),
                FailureKind::Unknown(UnknownCause::NotSentTransient),
                "{}",
                d.code().as_str()
            );
        }
        assert_eq!(
            classify(&ClientError::not_started()),
            FailureKind::Unknown(UnknownCause::NotSentTransient)
        );
    }

    #[test]
    fn argument_invalid_is_split_by_its_code() {
        let illegal = ClientError::from(MQClientException::new_with_code(13, "body too large"));
        assert_eq!(
            classify(&illegal),
            FailureKind::Definite(DefiniteCause::MessageIllegal)
        );
        for code in [10003, 10004, 10005] {
            let no_route = ClientError::from(MQClientException::new_with_code(code, "no route"));
            assert_eq!(
                classify(&no_route),
                FailureKind::Unknown(UnknownCause::NoRoute),
                "code {code}"
            );
        }
        assert_eq!(
            classify(&ClientError::route_not_found("T")),
            FailureKind::Unknown(UnknownCause::NoRoute)
        );
        assert_eq!(
            classify(&of(&rocketmq_error::CORE_ARGUMENT_INVALID)),
            FailureKind::Definite(DefiniteCause::InvalidArgument)
        );
        assert_eq!(
            classify(&of(&rocketmq_error::PROTOCOL_MESSAGE_PROPERTY_INVALID)),
            FailureKind::Definite(DefiniteCause::MessageIllegal)
        );
    }

    #[test]
    fn anything_else_is_possibly_stored() {
        for d in [
            &rocketmq_error::CORE_INTERNAL_FAILURE,
            &rocketmq_error::TRANSPORT_DISPATCH_FAILED,
            &rocketmq_error::TRANSPORT_RESPONSE_FAILED,
        ] {
            assert_eq!(
                classify(&of(d)),
                FailureKind::Unknown(UnknownCause::Unrecognized),
                "{}",
                d.code().as_str()
            );
        }
    }

    #[test]
    fn every_descriptor_is_classified_without_panicking_and_never_definite_by_accident() {
        for d in rocketmq_error::ALL_DESCRIPTORS {
            let kind = classify(&of(d));
            if let FailureKind::Definite(_) = kind {
                assert!(
                    d.code().as_str().contains("argument")
                        || d.code().as_str().contains("property"),
                    "{} classified definite",
                    d.code().as_str()
                );
            }
        }
    }
}
