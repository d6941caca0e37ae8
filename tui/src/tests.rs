//! `update()` for every key, and the screens as `TestBackend` snapshots.

use crate::state::{Component, ConfirmStage, Data, Focus, Mode, State};
use crate::update::{Effect, Key, Msg, suffix, update};
use chrono::{TimeZone, Utc};
use ratatui::Terminal;
use ratatui::backend::TestBackend;
use seckill_engine::{
    ActivityId, AlertConfig, AlertInputs, BacklogRow, DlqEntry, DlqEntryKey, DlqEntryStatus, Drain,
    FailureClass, Level, MessageId, PendingRow, PgView, PoolRow, Ratio, ReplayCheck as Check,
    ReplayDecision, ReplayId, ReplayOutcome, ReplayReport, ServerRow, Ticket, TicketId,
    TicketStatus, Verdict, alerts, replay,
};
use seckill_engine::{EngineRow, Seen, Singleton};
use std::collections::BTreeMap;
use std::time::Duration;

const NOW: i64 = 1_796_000_000_000;
const MSG: &str = "evt_01JDEADBEEF000000000ABCDEF";
const SECOND: &str = "evt_01JSECND000000000000000001";
const TKT_A: &str = "tkt_01JAAAAAAAAAAAAAAAAAAAAAAA";
const TKT_B: &str = "tkt_01JBBBBBBBBBBBBBBBBBBBBBBB";

fn msg(id: &str) -> MessageId {
    MessageId::parse(id).unwrap()
}

fn tkt(id: &str) -> TicketId {
    TicketId::parse(id).unwrap()
}

fn group(
    name: &str,
    lag_messages: i64,
    lag_seconds: f64,
    drain: Drain,
    verdict: Level,
) -> BacklogRow {
    BacklogRow {
        group: name.into(),
        topic: name.replace("CG_", "T_"),
        lag_messages,
        lag_seconds,
        retry_lag_messages: 0,
        inflight: Some(0),
        consume_per_s: Some(3_000.0),
        produce_per_s: Some(0.0),
        drain: Some(drain),
        seconds_to_oldest_expiry: Some(240.0),
        verdict,
        per_broker: Vec::new(),
    }
}

fn ticket(id: &str, owner: Option<&str>) -> Ticket {
    let at = Utc.timestamp_millis_opt(NOW - 600_000).unwrap();
    Ticket {
        ticket_id: tkt(id),
        consumer_group: "CG_SECKILL_ORDER_CREATE_PG_V1".into(),
        error_class: FailureClass::DbTimeout,
        status: TicketStatus::Open,
        owner: owner.map(str::to_owned),
        resolution: None,
        opened_at: at,
        updated_at: at,
        closed_at: None,
        messages: 3,
        dead: 2,
        oldest_dead_at: Some(at),
    }
}

fn entry(message_id: &str) -> DlqEntry {
    let at = Utc.timestamp_millis_opt(NOW - 300_000).unwrap();
    DlqEntry {
        consumer_group: "CG_SECKILL_ORDER_CREATE_PG_V1".into(),
        message_id: message_id.parse().unwrap(),
        ticket_id: Some(tkt(TKT_A)),
        original_topic: "PROD_SECKILL_ORDER_CREATE_V1".into(),
        broker_msg_id: "7F0000010000".into(),
        error_class: FailureClass::DbTimeout,
        delivery_attempts: 4,
        status: DlqEntryStatus::Dead,
        replay_count: 0,
        dead_at: at,
        mirrored_at: at,
        verified_at: None,
        body: Vec::new(),
        properties: serde_json::Value::Null,
    }
}

fn inputs_ok() -> AlertInputs {
    AlertInputs {
        pending_oldest_age_s: Some(0.0),
        consumer_lag_s: Some(0.3),
        send_unknown: Some(Ratio { bad: 0, total: 100 }),
        ack_failure: Some(Ratio { bad: 0, total: 100 }),
        dlq_dead: Some(0),
        dlq_oldest_age_s: None,
        pool_wait_p95_ms: Some(0.4),
        order_tx_p99_ms: Some(12.5),
        expiring: Some(0),
        expiring_before: Some(0),
        redis_state_lost: Some(vec![]),
    }
}

fn healthy() -> Data {
    Data {
        at_ms: NOW,
        components: ["postgresql", "redis", "rocketmq", "engine"]
            .map(|n| Component {
                name: n.into(),
                up: true,
                error: None,
            })
            .into(),
        backlog: vec![
            group(
                "CG_SECKILL_ORDER_CREATE_PG_V1",
                0,
                0.0,
                Drain::Empty,
                Level::Ok,
            ),
            group(
                "CG_SECKILL_ORDER_TIMEOUT_V1",
                12,
                0.3,
                Drain::In(0.1),
                Level::Ok,
            ),
        ],
        pending: vec![PendingRow {
            activity_id: ActivityId(77),
            count: 0,
            oldest_age_s: None,
            next_due_in_s: None,
            seconds_to_oldest_expiry: None,
            attempts: BTreeMap::new(),
            expiring: 0,
            truncated: false,
            verdict: Level::Ok,
        }],
        pg: PgView {
            pool: Some(PoolRow {
                size: 6,
                idle: 4,
                in_use: 2,
                max: 16,
                acquire_wait_p95_ms: 0.4,
            }),
            order_tx_p99_ms: Some(12.5),
            server: Some(ServerRow {
                active: 2,
                idle_in_transaction: 0,
                lock_waiters: 0,
                io_wait_share: 0.0,
                commits_per_s: Some(410.0),
                wal_bytes_per_s: Some(512_000.0),
                longest_tx_s: 0.02,
                connections: 12,
                max_connections: 100,
                autovacuum: Some(true),
                churn_dead_rows: 120,
                churn_dead_share: 0.01,
            }),
        },
        engines: vec![],
        alerts: alerts::evaluate(&AlertConfig::default(), &inputs_ok()),
        tickets: vec![],
        tickets_error: None,
    }
}

fn daemon(id: &str, port: u16, seen: Seen, roles: &[Singleton]) -> EngineRow {
    let live = seen == Seen::Answered;
    EngineRow {
        id: Some(id.into()),
        url: format!("http://127.0.0.1:{port}"),
        version: Some("0.1.0".into()),
        seen,
        roles: roles.to_vec(),
        heartbeat_age_ms: Some(if live { 400 } else { 42_000 }),
        inflight: live.then_some(7),
        orders_created: live.then_some(1_234),
        pool_in_use: live.then_some(3),
        pool_max: live.then_some(16),
        pool_wait_p95_ms: live.then_some(0.4),
        order_tx_p99_ms: live.then_some(12.0),
        send_circuit: live.then(|| "CLOSED".into()),
        admitting: live.then_some(true),
        error: None,
    }
}

/// Three daemons: two live (one running every singleton), one killed.
fn fleet() -> Data {
    let mut d = healthy();
    d.engines = vec![
        daemon(
            "engine-101-01JAAAAAAAAAAAAAAAAAAAAAAA",
            8080,
            Seen::Answered,
            &[Singleton::DlqMirror, Singleton::Sweeps, Singleton::Webhook],
        ),
        daemon(
            "engine-102-01JBBBBBBBBBBBBBBBBBBBBBBB",
            8081,
            Seen::Answered,
            &[],
        ),
        daemon(
            "engine-103-01JCCCCCCCCCCCCCCCCCCCCCCC",
            8082,
            Seen::Silent,
            &[],
        ),
    ];
    d
}

fn critical() -> Data {
    let mut d = healthy();
    d.backlog[0] = group(
        "CG_SECKILL_ORDER_CREATE_PG_V1",
        8_000,
        4.2,
        Drain::Never,
        Level::Critical,
    );
    d.tickets = vec![ticket(TKT_A, Some("alice")), ticket(TKT_B, None)];
    d.alerts = alerts::evaluate(
        &AlertConfig::default(),
        &AlertInputs {
            consumer_lag_s: Some(4.2),
            dlq_dead: Some(4),
            dlq_oldest_age_s: Some(600.0),
            ..Default::default()
        },
    );
    d
}

fn broker_down() -> Data {
    let mut d = healthy();
    d.components[2] = Component {
        name: "rocketmq".into(),
        up: false,
        error: Some("connection refused".into()),
    };
    d.backlog.clear();
    d.alerts = alerts::evaluate(
        &AlertConfig::default(),
        &AlertInputs {
            consumer_lag_s: None,
            expiring: None,
            ..inputs_ok()
        },
    );
    d
}

fn state_with(d: Data) -> State {
    let mut s = State::new(Duration::from_secs(1), false);
    update(&mut s, Msg::Refreshed(Box::new(d)));
    s
}

fn screen(s: &State) -> String {
    let mut t = Terminal::new(TestBackend::new(130, 40)).unwrap();
    t.draw(|f| crate::ui::render(s, f)).unwrap();
    t.backend().to_string()
}

fn key(s: &mut State, k: Key) -> Option<Effect> {
    update(s, Msg::Key(k))
}

fn type_text(s: &mut State, text: &str) {
    for c in text.chars() {
        assert_eq!(key(s, Key::Char(c)), None);
    }
}

/// A state inside ticket TKT_A with two messages loaded.
fn drilled(readonly: bool) -> State {
    let mut s = state_with(critical());
    s.readonly = readonly;
    key(&mut s, Key::Tab);
    assert_eq!(
        key(&mut s, Key::Enter),
        Some(Effect::LoadTicket(tkt(TKT_A)))
    );
    let e = update(
        &mut s,
        Msg::TicketLoaded {
            ticket_id: tkt(TKT_A),
            result: Ok((
                Some(ticket(TKT_A, Some("alice"))),
                vec![entry(MSG), entry(SECOND)],
            )),
        },
    );
    assert_eq!(
        e,
        Some(Effect::Precheck {
            group: "CG_SECKILL_ORDER_CREATE_PG_V1".into(),
            message_id: msg(MSG)
        })
    );
    s
}

fn verdicts() -> Vec<Verdict> {
    let v = |check, level, evidence: &str| Verdict {
        check,
        level,
        evidence: evidence.into(),
        forced: false,
    };
    vec![
        v(Check::Mirrored, replay::Level::Pass, "in dlq_messages"),
        v(Check::Inbox, replay::Level::Pass, "no inbox row"),
        v(Check::Order, replay::Level::Pass, "no order"),
        v(
            Check::Validity,
            replay::Level::Warn,
            "valid_until passed 40 s ago: the replay will be rejected and compensated once",
        ),
    ]
}

fn report(decision: ReplayDecision) -> ReplayReport {
    ReplayReport {
        replay_id: Some(ReplayId::parse("rpl_01J00000000000000000000001").unwrap()),
        consumer_group: "CG_SECKILL_ORDER_CREATE_PG_V1".into(),
        message_id: msg(MSG),
        ticket_id: Some(tkt(TKT_A)),
        checks: verdicts(),
        decision,
        outcome: ReplayOutcome::NotSent,
        replay_count: 1,
        detail: "dry run; nothing was sent".into(),
    }
}

#[test]
fn q_and_ctrl_c_quit() {
    let mut s = state_with(healthy());
    assert_eq!(key(&mut s, Key::Char('q')), Some(Effect::Quit));
    assert_eq!(update(&mut s, Msg::Quit), Some(Effect::Quit));
}

#[test]
fn question_mark_opens_help_and_any_key_closes_it() {
    let mut s = state_with(healthy());
    key(&mut s, Key::Char('?'));
    assert_eq!(s.mode, Mode::Help);
    assert_eq!(key(&mut s, Key::Char('x')), None);
    assert_eq!(s.mode, Mode::Normal);
}

#[test]
fn tab_switches_panels_and_arrows_move_within_them() {
    let mut s = state_with(critical());
    assert_eq!(s.focus, Focus::Backlog);
    key(&mut s, Key::Down);
    assert_eq!(s.sel_backlog, 1);
    key(&mut s, Key::Down);
    assert_eq!(s.sel_backlog, 1, "stops at the last row");
    key(&mut s, Key::Up);
    key(&mut s, Key::Up);
    assert_eq!(s.sel_backlog, 0);
    key(&mut s, Key::Tab);
    assert_eq!(s.focus, Focus::Tickets);
    key(&mut s, Key::Down);
    assert_eq!(s.selected_ticket().unwrap().ticket_id, tkt(TKT_B));
    key(&mut s, Key::BackTab);
    assert_eq!(s.focus, Focus::Backlog);
}

#[test]
fn enter_opens_the_selected_ticket_only_from_the_ticket_panel() {
    let mut s = state_with(critical());
    assert_eq!(key(&mut s, Key::Enter), None, "backlog focused");
    assert!(s.status.is_some());
    let s = drilled(false);
    assert_eq!(s.mode, Mode::Drill);
    assert_eq!(s.drill.as_ref().unwrap().entries.len(), 2);
}

#[test]
fn arrows_in_a_ticket_precheck_the_newly_selected_message() {
    let mut s = drilled(false);
    let e = key(&mut s, Key::Down);
    assert_eq!(
        e,
        Some(Effect::Precheck {
            group: "CG_SECKILL_ORDER_CREATE_PG_V1".into(),
            message_id: msg(SECOND)
        })
    );
    assert_eq!(key(&mut s, Key::Down), None, "already on the last one");
    // A late answer for another message is not shown against this one.
    update(
        &mut s,
        Msg::Verdicts {
            message_id: msg(MSG),
            result: Ok(verdicts()),
        },
    );
    assert!(s.drill.as_ref().unwrap().verdicts.is_none());
    key(&mut s, Key::Esc);
    assert_eq!(s.mode, Mode::Normal);
    assert!(s.drill.is_none());
}

#[test]
fn r_dry_runs_then_a_real_replay_needs_the_suffix_and_a_reason() {
    let mut s = drilled(false);
    assert_eq!(
        key(&mut s, Key::Char('r')),
        Some(Effect::DryRun {
            group: "CG_SECKILL_ORDER_CREATE_PG_V1".into(),
            message_id: msg(MSG)
        })
    );
    update(&mut s, Msg::DryRun(Ok(report(ReplayDecision::DryRun))));
    assert!(matches!(&s.mode, Mode::Confirm(c) if c.stage == ConfirmStage::Suffix));
    assert_eq!(suffix(MSG), "ABCDEF");
    // A wrong suffix is refused and cleared.
    type_text(&mut s, "ABCDEX");
    assert_eq!(key(&mut s, Key::Enter), None);
    assert!(matches!(&s.mode, Mode::Confirm(c) if c.stage == ConfirmStage::Suffix));
    assert!(s.input.is_empty());
    type_text(&mut s, "ABCDEF");
    assert_eq!(key(&mut s, Key::Enter), None);
    assert!(matches!(&s.mode, Mode::Confirm(c) if c.stage == ConfirmStage::Reason));
    // An empty reason is refused.
    type_text(&mut s, "  ");
    assert_eq!(key(&mut s, Key::Enter), None);
    key(&mut s, Key::Backspace);
    key(&mut s, Key::Backspace);
    type_text(&mut s, "PG is back");
    assert_eq!(
        key(&mut s, Key::Enter),
        Some(Effect::Replay {
            group: "CG_SECKILL_ORDER_CREATE_PG_V1".into(),
            message_id: msg(MSG),
            reason: "PG is back".into()
        })
    );
    assert_eq!(s.mode, Mode::Drill);
    // The result reloads the ticket.
    let mut done = report(ReplayDecision::Sent);
    done.outcome = ReplayOutcome::Verified;
    assert_eq!(
        update(&mut s, Msg::Replayed(Ok(done))),
        Some(Effect::LoadTicket(tkt(TKT_A)))
    );
    assert!(s.status.as_ref().unwrap().contains("VERIFIED"));
}

#[test]
fn esc_abandons_a_confirmation_and_a_blocked_dry_run_never_asks() {
    let mut s = drilled(false);
    key(&mut s, Key::Char('r'));
    update(&mut s, Msg::DryRun(Ok(report(ReplayDecision::DryRun))));
    assert_eq!(key(&mut s, Key::Esc), None);
    assert_eq!(s.mode, Mode::Drill);
    update(&mut s, Msg::DryRun(Ok(report(ReplayDecision::Blocked))));
    assert_eq!(s.mode, Mode::Drill, "blocked: nothing to confirm");
    assert!(s.status.as_ref().unwrap().contains("BLOCKED"));
}

#[test]
fn a_acknowledges_or_assigns() {
    let mut s = state_with(critical());
    key(&mut s, Key::Tab);
    key(&mut s, Key::Char('a'));
    assert_eq!(s.mode, Mode::Assign);
    assert_eq!(key(&mut s, Key::Enter), Some(Effect::Ack(tkt(TKT_A))));
    key(&mut s, Key::Char('a'));
    type_text(&mut s, "bob");
    assert_eq!(
        key(&mut s, Key::Enter),
        Some(Effect::Assign {
            ticket_id: tkt(TKT_A),
            owner: "bob".into()
        })
    );
    key(&mut s, Key::Char('a'));
    assert_eq!(key(&mut s, Key::Esc), None);
    assert_eq!(s.mode, Mode::Normal);
    // Inside a ticket, `a` acts on that ticket.
    let mut d = drilled(false);
    key(&mut d, Key::Char('a'));
    assert_eq!(key(&mut d, Key::Enter), Some(Effect::Ack(tkt(TKT_A))));
    assert_eq!(d.mode, Mode::Drill);
}

#[test]
fn slash_filters_groups_and_tickets_and_esc_clears() {
    let mut s = state_with(critical());
    key(&mut s, Key::Char('/'));
    assert_eq!(s.mode, Mode::Filter);
    type_text(&mut s, "order_timeoutx");
    key(&mut s, Key::Backspace);
    key(&mut s, Key::Enter);
    assert_eq!(s.filter, "order_timeout");
    assert_eq!(s.backlog().len(), 1);
    assert!(s.tickets().is_empty(), "both tickets are order-create");
    key(&mut s, Key::Char('/'));
    type_text(&mut s, "zzz");
    key(&mut s, Key::Esc);
    assert_eq!(
        s.filter, "order_timeout",
        "Esc while typing keeps the old filter"
    );
    key(&mut s, Key::Esc);
    assert_eq!(s.filter, "");
    assert_eq!(s.backlog().len(), 2);
}

#[test]
fn readonly_hides_every_mutating_key() {
    let mut s = drilled(true);
    assert_eq!(key(&mut s, Key::Char('r')), None);
    assert_eq!(key(&mut s, Key::Char('a')), None);
    assert_eq!(s.mode, Mode::Drill);
    // A dry-run result (from elsewhere) never opens a confirmation either.
    update(&mut s, Msg::DryRun(Ok(report(ReplayDecision::DryRun))));
    assert_eq!(s.mode, Mode::Drill);
    assert!(!screen(&s).contains("r dry-run"));
}

#[test]
fn a_down_component_keeps_its_last_seen_time_and_history_is_bounded() {
    let mut s = state_with(healthy());
    let mut later = broker_down();
    later.at_ms = NOW + 42_000;
    update(&mut s, Msg::Refreshed(Box::new(later)));
    assert_eq!(s.last_seen["rocketmq"], NOW);
    assert!(screen(&s).contains("rocketmq DOWN (last seen 42s ago)"));
    for i in 0..400 {
        let mut d = healthy();
        d.at_ms = NOW + i * 1000;
        update(&mut s, Msg::Refreshed(Box::new(d)));
    }
    assert_eq!(
        s.lag_history["CG_SECKILL_ORDER_CREATE_PG_V1"].len(),
        300,
        "5 minutes at 1 s"
    );
    update(&mut s, Msg::RefreshFailed("boom".into()));
    assert!(
        s.data.is_some(),
        "a failed refresh keeps the last data on screen"
    );
}

#[test]
fn data_older_than_three_refreshes_is_marked_stale() {
    let mut s = state_with(healthy());
    update(&mut s, Msg::Tick(NOW + 2_000));
    assert!(!screen(&s).contains("STALE"));
    update(&mut s, Msg::Tick(NOW + 10_000));
    assert!(
        screen(&s).contains("STALE: last refresh 10s ago"),
        "{}",
        screen(&s)
    );
}

#[test]
fn unreadable_tickets_are_not_shown_as_none_open() {
    let mut d = healthy();
    d.tickets_error = Some("PostgreSQL did not answer".into());
    let s = state_with(d);
    assert!(screen(&s).contains("DLQ tickets: unreadable (PostgreSQL did not answer)"));
}

#[test]
fn snapshot_healthy() {
    insta::assert_snapshot!(screen(&state_with(healthy())));
}

#[test]
fn snapshot_every_engine_with_its_role_live_or_dead() {
    let text = screen(&state_with(fleet()));
    assert!(text.contains("engines: 2 live of 3"), "{text}");
    assert!(text.contains("DEAD silent 42s"), "{text}");
    assert!(text.contains("dlq-mirror,sweeps,webhook"), "{text}");
    insta::assert_snapshot!(text);
}

#[test]
fn snapshot_backlog_critical() {
    let mut s = state_with(critical());
    // A rising lag for the sparkline.
    for (i, lag) in [0.5, 1.0, 2.0, 3.0, 4.2].into_iter().enumerate() {
        let mut d = critical();
        d.at_ms = NOW + i as i64 * 1000;
        d.backlog[0].lag_seconds = lag;
        update(&mut s, Msg::Refreshed(Box::new(d)));
    }
    insta::assert_snapshot!(screen(&s));
}

#[test]
fn snapshot_broker_down() {
    let mut s = state_with(healthy());
    let mut d = broker_down();
    d.at_ms = NOW + 65_000;
    update(&mut s, Msg::Refreshed(Box::new(d)));
    insta::assert_snapshot!(screen(&s));
}

#[test]
fn snapshot_ticket_drill_down() {
    let mut s = drilled(false);
    update(
        &mut s,
        Msg::Verdicts {
            message_id: msg(MSG),
            result: Ok(verdicts()),
        },
    );
    insta::assert_snapshot!(screen(&s));
}

#[test]
fn an_entry_without_a_message_id_is_shown_but_never_prechecked_or_replayed() {
    let mut s = drilled(false);
    let d = s.drill.as_mut().unwrap();
    d.entries.push(entry("broker:7F0000010000"));
    assert_eq!(
        d.entries[2].message_id,
        DlqEntryKey::Foreign("broker:7F0000010000".into())
    );
    key(&mut s, Key::Down);
    assert_eq!(key(&mut s, Key::Down), None, "nothing to pre-check");
    let why = match &s.drill.as_ref().unwrap().verdicts {
        Some(Err(e)) => e.to_string(),
        other => panic!("{other:?}"),
    };
    assert!(why.contains("is not a message_id (evt_<ULID>)"), "{why}");
    assert_eq!(key(&mut s, Key::Char('r')), None, "no dry run either");
    assert!(
        s.status
            .as_ref()
            .unwrap()
            .contains("dlq show --message-id broker:")
    );
    assert!(screen(&s).contains("broker:7F0000010000"));
}

#[test]
fn a_lost_redis_state_is_in_the_header_and_the_alerts_strip() {
    let mut d = healthy();
    d.alerts = alerts::evaluate(
        &AlertConfig::default(),
        &AlertInputs {
            redis_state_lost: Some(vec!["activity 7 (LOST)".into()]),
            ..inputs_ok()
        },
    );
    let text = screen(&state_with(d));
    let header: String = text.lines().take(3).collect();
    assert!(header.contains("redis_state_lost"), "{text}");
    assert!(text.contains("activity 7 (LOST)"), "{text}");
}

#[test]
fn t_in_a_ticket_traces_the_selected_message_and_shows_its_story() {
    let mut s = drilled(true);
    assert_eq!(
        key(&mut s, Key::Char('t')),
        Some(Effect::Trace(msg(MSG))),
        "read-only screens trace too"
    );
    use seckill_engine::{ActivityId, ReservationId, Story, StoryVerdict, TraceId, TraceLine};
    let rsv = ReservationId::generate();
    let story = Story {
        anchor: MSG.to_owned(),
        trace_id: TraceId::of_reservation(&rsv),
        reservation_id: rsv,
        activity_id: ActivityId(7),
        lines: vec![TraceLine {
            at: Some(Utc.with_ymd_and_hms(2026, 12, 6, 6, 0, 0).unwrap()),
            source: "broker",
            event: "dead-lettered".to_owned(),
            detail: "in %DLQ% queue 0 offset 3".to_owned(),
        }],
        verdict: StoryVerdict::Broken,
        reason: "its message is dead in the DLQ with no effect".to_owned(),
    };
    assert_eq!(update(&mut s, Msg::Traced(Ok(story))), None);
    let shown = screen(&s);
    assert!(shown.contains("BROKEN"), "{shown}");
    assert!(shown.contains("dead-lettered"), "{shown}");
    // Another message: back to its pre-checks.
    key(&mut s, Key::Down);
    assert!(s.drill.as_ref().unwrap().story.is_none());
}
