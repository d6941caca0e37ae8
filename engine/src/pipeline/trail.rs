//! The order path's log lines (docs/architecture.md §11.3), in one place so
//! their field names stay the same everywhere:
//! `trace_id`, `message_id`, `reservation_id`, `order_id`, `activity_id`,
//! `sku_id`, `user_id`; `topic`, `group`, `queue`, `offset`,
//! `retry_count`, `replay_count`; `outcome`, `latency_ms`; and `stage`
//! (`ingress`, `publish`, `resend`, `consume`, `lifecycle`).
//!
//! INFO is one line a batch; DEBUG adds one line a message, and its loop
//! runs only when DEBUG is on. A send whose outcome is unknown or failed
//! names its reservations and traces at WARN or ERROR, so on-call can
//! follow them without DEBUG.

use crate::domain::ids::{OrderId, ReservationId};
use crate::domain::message::OrderCreateRequested;
use crate::domain::trace::TraceId;
use crate::mq::{IncomingMessage, SendOutcome};
use crate::reservation::Reservation;
use std::time::Duration;
use tracing::Level;

pub const INGRESS: &str = "ingress";
pub const PUBLISH: &str = "publish";
pub const RESEND: &str = "resend";
pub const CONSUME: &str = "consume";
pub const LIFECYCLE: &str = "lifecycle";

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// A reservation taken and queued for its first send (DEBUG).
pub fn queued(r: &Reservation, latency: Duration) {
    tracing::debug!(
        stage = INGRESS,
        trace_id = %r.trace_id,
        reservation_id = %r.reservation_id,
        message_id = %r.message_id,
        order_id = %r.order_id,
        activity_id = %r.activity_id,
        sku_id = %r.sku_id,
        user_id = %r.user_id,
        outcome = "QUEUED",
        latency_ms = ms(latency),
        "reservation queued"
    );
}

/// A reservation request turned down (DEBUG): `outcome` is the API's code.
pub fn refused(activity_id: i64, sku_id: i64, user_id: i64, outcome: &str) {
    tracing::debug!(
        stage = INGRESS,
        activity_id,
        sku_id,
        user_id,
        outcome,
        "reservation refused"
    );
}

/// The stage of a send: the scanner's re-sends carry a retry count.
fn send_stage(batch: &[OrderCreateRequested]) -> &'static str {
    if batch.iter().any(|m| m.retry_count > 0) {
        RESEND
    } else {
        PUBLISH
    }
}

/// One send of order-create messages: INFO (WARN or ERROR when the
/// outcome is not confirmed, with every reservation and trace of the
/// batch), and one DEBUG line a message.
pub fn sent(topic: &str, batch: &[OrderCreateRequested], outcome: &SendOutcome, latency: Duration) {
    let stage = send_stage(batch);
    let n = batch.len();
    let latency_ms = ms(latency);
    let ids = || {
        let rsv: Vec<String> = batch.iter().map(|m| m.reservation_id.to_string()).collect();
        let traces: Vec<&str> = batch.iter().map(|m| m.trace.trace_id.as_str()).collect();
        (rsv.join(","), traces.join(","))
    };
    let (outcome_name, queue, offset) = match outcome {
        SendOutcome::Confirmed(r) => {
            tracing::info!(
                stage,
                topic,
                n,
                outcome = "CONFIRMED",
                queue = r.queue_id,
                offset = r.queue_offset,
                latency_ms,
                "order messages sent"
            );
            ("CONFIRMED", r.queue_id, Some(r.queue_offset))
        }
        SendOutcome::Unknown { cause, detail } => {
            let (reservation_ids, trace_ids) = ids();
            tracing::warn!(
                stage, topic, n, outcome = "UNKNOWN", ?cause, error = %detail, latency_ms,
                reservation_ids, trace_ids,
                "send outcome unknown; the scanner re-sends with the same message_id"
            );
            ("UNKNOWN", None, None)
        }
        SendOutcome::DefiniteFailure { detail, .. } => {
            let (reservation_ids, trace_ids) = ids();
            tracing::error!(
                stage, topic, n, outcome = "FAILED", error = %detail, latency_ms,
                reservation_ids, trace_ids,
                "send failed"
            );
            ("FAILED", None, None)
        }
    };
    if tracing::enabled!(Level::DEBUG) {
        for m in batch {
            tracing::debug!(
                stage,
                topic,
                trace_id = %m.trace.trace_id,
                message_id = %m.message_id,
                reservation_id = %m.reservation_id,
                order_id = %m.order_id,
                activity_id = %m.activity_id,
                sku_id = %m.sku_id,
                user_id = %m.user_id,
                retry_count = m.retry_count,
                queue,
                offset,
                outcome = outcome_name,
                latency_ms,
                "order message sent"
            );
        }
    }
}

/// A scanner worker could not finish its batch (WARN): its reservations
/// stay leased and retry after the lease.
pub fn resend_failed(batch: &[OrderCreateRequested], error: &dyn std::fmt::Display) {
    let reservation_ids: Vec<String> = batch.iter().map(|m| m.reservation_id.to_string()).collect();
    let trace_ids: Vec<&str> = batch.iter().map(|m| m.trace.trace_id.as_str()).collect();
    tracing::warn!(
        stage = RESEND,
        n = batch.len(),
        error = %error,
        reservation_ids = reservation_ids.join(","),
        trace_ids = trace_ids.join(","),
        "scanner worker failed; its reservations retry after the lease"
    );
}

/// One consumed order-create message: what became of it.
pub struct Consumed<'a> {
    pub msg: &'a OrderCreateRequested,
    pub trace_id: TraceId,
    pub queue: Option<i32>,
    pub offset: Option<i64>,
    /// The broker's redelivery count.
    pub retry_count: i32,
    /// `CREATED`, `ALREADY_PROCESSED`, `DUPLICATE_RESERVATION` or the
    /// rejection's reservation outcome.
    pub outcome: &'static str,
}

/// How one committed order transaction went, by outcome.
#[derive(Debug, Default, Clone, Copy)]
pub struct Tally {
    pub created: usize,
    pub rejected: usize,
    pub duplicates: usize,
}

/// One committed order transaction: INFO for the batch, and DEBUG a
/// message (the iterator is walked only then).
pub fn consumed<'a>(
    group: &str,
    topic: &str,
    tally: Tally,
    latency: Duration,
    each: impl Iterator<Item = Consumed<'a>>,
) {
    let latency_ms = ms(latency);
    tracing::info!(
        stage = CONSUME,
        group,
        topic,
        n = tally.created + tally.rejected + tally.duplicates,
        created = tally.created,
        rejected = tally.rejected,
        duplicates = tally.duplicates,
        outcome = "COMMITTED",
        latency_ms,
        "order batch committed"
    );
    if tracing::enabled!(Level::DEBUG) {
        for c in each {
            let m = c.msg;
            tracing::debug!(
                stage = CONSUME,
                group,
                topic,
                queue = c.queue,
                offset = c.offset,
                retry_count = c.retry_count,
                replay_count = m.replay_count,
                trace_id = %c.trace_id,
                message_id = %m.message_id,
                reservation_id = %m.reservation_id,
                order_id = %m.order_id,
                activity_id = %m.activity_id,
                sku_id = %m.sku_id,
                user_id = %m.user_id,
                outcome = c.outcome,
                latency_ms,
                "order message consumed"
            );
        }
    }
}

/// A lifecycle message settled (DEBUG): a cancel, a release, an order
/// event for the projection.
pub fn settled(
    group: &str,
    d: &IncomingMessage,
    reservation_id: &ReservationId,
    order_id: Option<&OrderId>,
    outcome: &str,
) {
    if tracing::enabled!(Level::DEBUG) {
        tracing::debug!(
            stage = LIFECYCLE,
            group,
            topic = %d.topic,
            queue = d.queue_id,
            offset = d.queue_offset,
            retry_count = d.reconsume_times,
            replay_count = d.property(crate::mq::PROP_REPLAY_COUNT),
            trace_id = trace_of(d),
            message_id = d.message_id(),
            reservation_id = %reservation_id,
            order_id = order_id.map(tracing::field::display),
            outcome,
            "lifecycle message settled"
        );
    }
}

/// The trace id of a delivered message's `traceparent`, if it has one.
pub fn trace_of(d: &IncomingMessage) -> Option<String> {
    d.property(crate::mq::PROP_TRACEPARENT)
        .and_then(crate::domain::trace::parse_traceparent)
        .map(|t| t.to_string())
}

/// Links a stage's batch span to the span of every message it carries
/// (docs/architecture.md §11.5): a batch serves many reservations, so it
/// cannot sit inside one reservation's trace; with an OpenTelemetry layer
/// (feature `otlp`), a trace viewer goes from the batch to each of them.
/// Without the feature, or when nothing records the span, it does nothing.
pub fn link<'a>(span: &tracing::Span, traceparents: impl IntoIterator<Item = &'a str>) {
    #[cfg(feature = "otlp")]
    {
        use tracing_opentelemetry::OpenTelemetrySpanExt;
        if span.is_disabled() {
            return;
        }
        for cx in traceparents.into_iter().filter_map(span_context) {
            span.add_link(cx);
        }
    }
    #[cfg(not(feature = "otlp"))]
    let _ = (span, traceparents);
}

/// The span a `traceparent` header names, as a remote span context; `None`
/// for a header that W3C Trace Context says to ignore.
#[cfg(feature = "otlp")]
fn span_context(traceparent: &str) -> Option<opentelemetry::trace::SpanContext> {
    use opentelemetry::trace::{
        SpanContext, SpanId, TraceFlags, TraceId as OtelTraceId, TraceState,
    };
    let trace = crate::domain::trace::parse_traceparent(traceparent)?;
    let mut parts = traceparent.trim().split('-').skip(2);
    let span_id = SpanId::from_hex(parts.next()?).ok()?;
    let flags = u8::from_str_radix(parts.next()?.get(..2)?, 16).ok()?;
    Some(SpanContext::new(
        OtelTraceId::from_hex(trace.as_str()).ok()?,
        span_id,
        TraceFlags::new(flags),
        true,
        TraceState::default(),
    ))
}

#[cfg(all(test, feature = "otlp"))]
mod tests {
    use super::*;

    #[test]
    fn a_valid_traceparent_names_a_remote_span_and_a_bad_one_nothing() {
        let cx =
            span_context("00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01").expect("valid");
        assert_eq!(
            cx.trace_id().to_string(),
            "4bf92f3577b34da6a3ce929d0e0e4736"
        );
        assert_eq!(cx.span_id().to_string(), "00f067aa0ba902b7");
        assert!(cx.is_remote() && cx.is_sampled());
        for bad in [
            "",
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7",
            "ff-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
        ] {
            assert!(span_context(bad).is_none(), "{bad:?}");
        }
    }
}
