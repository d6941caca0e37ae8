//! The DLQ loop (docs/architecture.md §9) against the real broker: a poison message
//! exhausts its retries, lands in `%DLQ%<group>`, is mirrored with the
//! error class its consumer recorded, and gets a ticket whose lifecycle
//! the operator moves.

use anyhow::ensure;
use chrono::{Duration as ChronoDuration, Utc};
use seckill_engine::{
    ActivityId, ApplyError, BulkRequest, CheckLevel as Level, ConsumerSpec, DlqEntryKey,
    DlqEntryStatus, FailureClass, MessageId, OrderConsumer, OrderId, Producer, ReplayDecision,
    ReplayError, ReplayOutcome, ReplayRequest, RocketConsumer, RocketProducer, SkuId, StoryVerdict,
    TicketAction, TicketError, TicketId, TicketStatus, TopicKind, TraceAnchor, TraceSources,
    UserId, message::OrderCreateRequested, mirror_once, publish::to_outgoing, replay::Check,
    replay::replay, replay::replay_ticket, tickets, trace_story,
};
use seckill_tests::{Setup, eventually, run};
use secrecy::ExposeSecret;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;

/// The broker's default retention of dead messages (72 h).
const RETENTION: Duration = Duration::from_secs(72 * 3600);

/// The real order-create consumer on the real broker.
async fn order_consumer(
    env: &seckill_tests::TestEnv,
    spec: ConsumerSpec,
) -> anyhow::Result<RocketConsumer> {
    Ok(RocketConsumer::start(
        env.rt.clone(),
        &env.cfg.namesrv_addr,
        &spec,
        Arc::new(OrderConsumer::new(env.pool.clone(), env.names.clone())),
    )
    .await?)
}

async fn producer(env: &seckill_tests::TestEnv) -> anyhow::Result<RocketProducer> {
    Ok(RocketProducer::start(
        env.rt.clone(),
        &env.cfg.namesrv_addr,
        &env.names.producer_group(),
        Duration::from_secs(3),
        1,
    )
    .await?)
}

fn order_msg(activity: ActivityId, sku: SkuId) -> OrderCreateRequested {
    seckill_tests::order_create(activity, sku, 1)
}

#[test]
fn a_poison_message_is_dead_lettered_mirrored_ticketed_and_replayed_once() {
    run(Setup::Full, |env| async move {
        // The poison: a transient fault. Another transaction holds the SKU's
        // inventory row, and the consumer's connections give up on a lock
        // after 300 ms (DB_TIMEOUT), record each failure and ask for a retry;
        // the broker dead-letters the message after 1 retry.
        let (activity, sku) = (ActivityId(5), SkuId(9));
        sqlx::query("INSERT INTO activities (activity_id, valid_for_ms, pay_within_ms) VALUES ($1, 300000, 900000)")
            .bind(activity)
            .execute(&env.pool)
            .await?;
        sqlx::query("INSERT INTO inventory (activity_id, sku_id, total_stock, available_stock) VALUES ($1, $2, 5, 5)")
            .bind(activity)
            .bind(sku)
            .execute(&env.pool)
            .await?;
        let mut holder = env.pool.begin().await?;
        sqlx::query("SELECT 1 FROM inventory WHERE activity_id = $1 AND sku_id = $2 FOR UPDATE")
            .bind(activity)
            .bind(sku)
            .execute(&mut *holder)
            .await?;
        let impatient = sqlx::postgres::PgPoolOptions::new()
            .max_connections(4)
            .connect_with(
                sqlx::postgres::PgConnectOptions::from_str(env.cfg.database_url.expose_secret())?
                    .options([("lock_timeout", "300ms")]),
            )
            .await?;
        let kind = TopicKind::OrderCreate;
        let (topic, group) = (env.names.topic(kind), env.names.group(kind));
        env.admin.ensure_group(&group, 1).await?;
        let mut spec = ConsumerSpec::new(group.clone(), topic.clone());
        spec.max_reconsume_times = 1;
        let consumer = RocketConsumer::start(
            env.rt.clone(),
            &env.cfg.namesrv_addr,
            &spec,
            Arc::new(OrderConsumer::new(impatient, env.names.clone())),
        )
        .await?;
        let producer = producer(&env).await?;
        let m = order_msg(activity, sku);
        let sent = producer
            .send(to_outgoing(&m, &topic), Duration::from_secs(3))
            .await;
        ensure!(sent.is_confirmed(), "{sent:?}");

        // Nothing is mirrored before it dies; the DLQ topic may not exist yet.
        let report = mirror_once(&env.admin, &env.pool, &env.names).await?;
        assert_eq!(report.mirrored, 0);

        let report = eventually(
            Duration::from_secs(120),
            "the dead message mirrored",
            || async {
                let r = mirror_once(&env.admin, &env.pool, &env.names).await?;
                Ok((r.mirrored > 0).then_some(r))
            },
        )
        .await?;
        assert_eq!(report.mirrored, 1);
        assert_eq!(report.opened.len(), 1, "one ticket opened");
        let (ticket, ticket_group, class) = report.opened[0].clone();
        assert_eq!(
            (ticket_group.as_str(), class),
            (group.as_str(), FailureClass::DbTimeout)
        );

        let entries = tickets::list_entries(&env.pool, Some(&group), None, None).await?;
        assert_eq!(entries.len(), 1);
        let e = &entries[0];
        assert_eq!(e.message_id, DlqEntryKey::Message(m.message_id.clone()));
        assert_eq!(e.original_topic, topic);
        assert_eq!(e.error_class, FailureClass::DbTimeout);
        assert_eq!(e.delivery_attempts, 2, "first delivery and one retry");
        assert_eq!(e.status, DlqEntryStatus::Dead);
        assert_eq!(e.ticket_id.as_ref(), Some(&ticket));
        let body: OrderCreateRequested = serde_json::from_slice(&e.body)?;
        assert_eq!(body, m, "the body survives intact");
        assert!(Utc::now() - e.dead_at < ChronoDuration::minutes(5));

        // The detail view carries the recorded failures and the business state.
        let detail = tickets::show_entries(&env.pool, &m.message_id.clone().into()).await?;
        assert_eq!(detail.len(), 1);
        assert_eq!(detail[0].failures.len(), 2, "{:?}", detail[0].failures);
        assert!(
            detail[0]
                .failures
                .iter()
                .all(|f| f.error_class == FailureClass::DbTimeout),
            "{:?}",
            detail[0].failures
        );
        assert_eq!(detail[0].inbox, None, "never applied");
        assert_eq!(detail[0].order_status, None);

        // A second pass mirrors nothing new: the offsets were kept.
        let again = mirror_once(&env.admin, &env.pool, &env.names).await?;
        assert_eq!((again.mirrored, again.opened.len()), (0, 0));

        // The DLQ > 0 alert fires while the message is dead.
        let alert = |report: seckill_engine::health::HealthReport| {
            report
                .components
                .into_iter()
                .find(|c| c.component == "alert: dlq")
        };
        let firing =
            alert(seckill_engine::health::check(&env.cfg, env.rt.clone()).await).expect("dlq row");
        assert_eq!(firing.state, seckill_engine::health::HealthState::Degraded);
        assert!(
            firing
                .detail
                .unwrap_or_default()
                .contains("runbooks/dlq.md")
        );

        // Replay. Bad requests write nothing and send nothing.
        let id = m.message_id.clone();
        let req = |reason: &str, dry_run: bool, force: Vec<Check>| ReplayRequest {
            message_id: id.clone(),
            group: None,
            reason: reason.into(),
            actor: seckill_tests::test_actor(),
            dry_run,
            force,
            verify_within: Duration::from_secs(60),
            include_replayed: false,
            retention: RETENTION,
        };
        let audits = || async {
            Ok::<i64, anyhow::Error>(
                sqlx::query_scalar("SELECT count(*) FROM replay_audit")
                    .fetch_one(&env.pool)
                    .await?,
            )
        };
        assert!(matches!(
            replay(&env.pool, &env.names, &producer, &req("  ", false, vec![])).await,
            Err(ReplayError::NoReason)
        ));
        assert!(matches!(
            replay(
                &env.pool,
                &env.names,
                &producer,
                &req("x", false, vec![Check::Schema])
            )
            .await,
            Err(ReplayError::NotForceable(Check::Schema))
        ));
        let unknown = ReplayRequest {
            message_id: MessageId::generate(),
            ..req("x", false, vec![])
        };
        assert!(matches!(
            replay(&env.pool, &env.names, &producer, &unknown).await,
            Err(ReplayError::Unknown(_))
        ));
        assert_eq!(audits().await?, 0, "refused requests leave no audit row");

        // A dry run: every check passes, nothing is sent, the audit says so.
        let dry = replay(
            &env.pool,
            &env.names,
            &producer,
            &req("inventory row added", true, vec![]),
        )
        .await?;
        assert_eq!(
            (dry.decision, dry.outcome),
            (ReplayDecision::DryRun, ReplayOutcome::NotSent)
        );
        assert!(
            dry.checks.iter().all(|c| c.level == Level::Pass),
            "{:#?}",
            dry.checks
        );

        // Remove the fault, then replay for real: exactly one order.
        holder.rollback().await?;
        let done = replay(
            &env.pool,
            &env.names,
            &producer,
            &req("inventory row added", false, vec![]),
        )
        .await?;
        assert_eq!(
            (done.decision, done.outcome),
            (ReplayDecision::Sent, ReplayOutcome::Verified),
            "{done:#?}"
        );
        assert_eq!(done.replay_count, 1);
        let one_effect = || async {
            let n = |sql: &'static str| {
                let pool = env.pool.clone();
                async move { Ok::<i64, anyhow::Error>(sqlx::query_scalar(sql).fetch_one(&pool).await?) }
            };
            assert_eq!(n("SELECT count(*) FROM orders").await?, 1);
            assert_eq!(n("SELECT count(*) FROM inventory_ledger").await?, 1);
            assert_eq!(n("SELECT count(*) FROM consumer_inbox").await?, 1);
            Ok::<(), anyhow::Error>(())
        };
        one_effect().await?;
        let replay_id: Option<String> = sqlx::query_scalar("SELECT replay_id FROM consumer_inbox")
            .fetch_one(&env.pool)
            .await?;
        assert_eq!(
            replay_id.as_deref(),
            done.replay_id.as_ref().map(|r| r.as_str()),
            "the lineage reached the inbox"
        );
        let e = &tickets::list_entries(&env.pool, Some(&group), None, None).await?[0];
        assert_eq!((e.status, e.replay_count), (DlqEntryStatus::Verified, 1));
        // The operator audit log: the dry run and the replay, each an intent
        // completed with the entry after (docs/security.md).
        let rows = env.audit_of(done.message_id.as_str()).await?;
        let seen: Vec<(&str, &str)> = rows
            .iter()
            .map(|r| (r.command.as_str(), r.outcome.as_str()))
            .collect();
        assert_eq!(
            seen,
            [
                ("dlq replay", "VERIFIED"),
                ("dlq replay --dry-run", "DRY_RUN")
            ]
        );
        assert_eq!(
            rows[0].before.as_ref().map(|b| b["status"].clone()),
            Some("DEAD".into())
        );
        assert_eq!(
            rows[0].after.as_ref().map(|a| a["status"].clone()),
            Some("VERIFIED".into())
        );
        let quiet =
            alert(seckill_engine::health::check(&env.cfg, env.rt.clone()).await).expect("dlq row");
        assert_eq!(
            quiet.state,
            seckill_engine::health::HealthState::Up,
            "{quiet:?}"
        );

        // The mirror's offsets are the broker's own: each broker has its own
        // queue 0 (docs/architecture.md §9.1).
        let brokers: Vec<String> = sqlx::query_scalar(
            "SELECT DISTINCT broker_name FROM dlq_mirror_offsets WHERE consumer_group = $1",
        )
        .bind(&group)
        .fetch_all(&env.pool)
        .await?;
        let mut hosting: Vec<String> = env
            .admin
            .queue_offsets(&seckill_engine::dlq_topic(&group))
            .await?
            .into_iter()
            .map(|(b, _)| b)
            .collect();
        hosting.dedup();
        assert!(
            !brokers.is_empty() && brokers.iter().all(|b| hosting.contains(b)),
            "{brokers:?} of {hosting:?}"
        );
        // Offsets lost, or an offset of another broker's queue 0 far ahead:
        // the mirror reads this broker's DLQ again from its start, finds the
        // copy it mirrored, and changes nothing of the verified entry.
        sqlx::query("DELETE FROM dlq_mirror_offsets")
            .execute(&env.pool)
            .await?;
        sqlx::query(
            "INSERT INTO dlq_mirror_offsets (consumer_group, broker_name, queue_id, next_offset)
             SELECT $1, 'broker-z', q, 1000000 FROM generate_series(0, 7) q",
        )
        .bind(&group)
        .execute(&env.pool)
        .await?;
        let reread = mirror_once(&env.admin, &env.pool, &env.names).await?;
        assert_eq!(
            (reread.mirrored, reread.opened.len()),
            (1, 0),
            "read again, nothing opened"
        );
        let e = &tickets::list_entries(&env.pool, Some(&group), None, None).await?[0];
        assert_eq!(
            (e.status, e.replay_count),
            (DlqEntryStatus::Verified, 1),
            "the entry stays verified"
        );

        // Again: refused as already applied.
        let again = replay(
            &env.pool,
            &env.names,
            &producer,
            &req("again", false, vec![]),
        )
        .await?;
        assert_eq!(again.decision, ReplayDecision::Blocked);
        assert!(
            again
                .checks
                .iter()
                .any(|c| c.check == Check::Inbox && c.level == Level::Block)
        );
        // Forced past the checks: a VERIFIED entry is done, and says so
        // (dlq::entry); nothing is sent.
        let forced = replay(
            &env.pool,
            &env.names,
            &producer,
            &req(
                "forced on purpose",
                false,
                vec![Check::Inbox, Check::Order, Check::Ledger],
            ),
        )
        .await?;
        assert_eq!(
            (forced.decision, forced.outcome),
            (ReplayDecision::Blocked, ReplayOutcome::NotSent)
        );
        assert!(forced.detail.contains("already verified"), "{forced:#?}");
        one_effect().await?;
        let outcomes: Vec<(String, String)> = sqlx::query_as(
            "SELECT decision::text, outcome::text FROM replay_audit ORDER BY created_at",
        )
        .fetch_all(&env.pool)
        .await?;
        let outcomes: Vec<(&str, &str)> = outcomes
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        assert_eq!(
            outcomes,
            vec![
                ("DRY_RUN", "NOT_SENT"),
                ("SENT", "VERIFIED"),
                ("BLOCKED", "NOT_SENT"),
                ("BLOCKED", "NOT_SENT")
            ]
        );
        consumer.shutdown().await;
        producer.shutdown().await;

        // The ticket lifecycle.
        let t = tickets::get_ticket(&env.pool, &ticket)
            .await?
            .expect("ticket");
        assert_eq!(
            (t.status, t.messages, t.dead),
            (TicketStatus::Verified, 1, 0),
            "one message, replayed and verified: the ticket follows it"
        );
        let t = tickets::apply(
            &env.pool,
            &ticket,
            &TicketAction::Assign {
                owner: "alice".into(),
            },
            &seckill_tests::test_actor(),
        )
        .await?;
        assert_eq!(
            (t.status, t.owner.as_deref()),
            (TicketStatus::Verified, Some("alice"))
        );
        let empty = tickets::apply(
            &env.pool,
            &ticket,
            &TicketAction::Close {
                resolution: " ".into(),
                force: false,
            },
            &seckill_tests::test_actor(),
        )
        .await;
        assert!(matches!(
            empty,
            Err(ApplyError::Ticket(TicketError::Empty("--resolution")))
        ));
        let t = tickets::apply(
            &env.pool,
            &ticket,
            &TicketAction::Close {
                resolution: "inventory row added".into(),
                force: false,
            },
            &seckill_tests::test_actor(),
        )
        .await?;
        assert_eq!(t.status, TicketStatus::Closed);
        assert!(t.closed_at.is_some());
        // Both moves are in the operator audit log with the ticket before
        // and after; the refused close (empty resolution) is not.
        let rows = env.audit_of(ticket.as_str()).await?;
        let seen: Vec<(&str, &str)> = rows
            .iter()
            .map(|r| (r.command.as_str(), r.outcome.as_str()))
            .collect();
        assert_eq!(
            seen,
            [
                ("dlq ticket close", "CLOSED"),
                ("dlq ticket assign", "VERIFIED")
            ]
        );
        let (before, after) = (rows[1].before.as_ref(), rows[1].after.as_ref());
        assert_eq!(
            before.map(|b| b["owner"].clone()),
            Some(serde_json::Value::Null)
        );
        assert_eq!(after.map(|a| a["owner"].clone()), Some("alice".into()));
        assert_eq!(rows[0].reason.as_deref(), Some("inventory row added"));
        assert_eq!(rows[0].actor, "integration-test");
        let refused = tickets::apply(
            &env.pool,
            &ticket,
            &TicketAction::Ack,
            &seckill_tests::test_actor(),
        )
        .await;
        assert!(matches!(
            refused,
            Err(ApplyError::Ticket(TicketError::Refused { .. }))
        ));
        let unknown = tickets::apply(
            &env.pool,
            &TicketId::generate(),
            &TicketAction::Ack,
            &seckill_tests::test_actor(),
        )
        .await;
        assert!(matches!(
            unknown,
            Err(ApplyError::Ticket(TicketError::Unknown(_)))
        ));
        Ok(())
    });
}

#[test]
fn replaying_an_expired_reservation_warns_then_rejects_and_compensates_once() {
    run(Setup::Full, |env| async move {
        let (activity, sku) = (ActivityId(6), SkuId(2));
        sqlx::query("INSERT INTO activities (activity_id, valid_for_ms, pay_within_ms) VALUES ($1, 300000, 900000)")
            .bind(activity)
            .execute(&env.pool)
            .await?;
        sqlx::query("INSERT INTO inventory (activity_id, sku_id, total_stock, available_stock) VALUES ($1, $2, 5, 5)")
            .bind(activity)
            .bind(sku)
            .execute(&env.pool)
            .await?;
        // A dead order whose reservation expired a minute ago, as the mirror
        // would have left it.
        let mut m = order_msg(activity, sku);
        m.reservation_valid_until = Utc::now() - ChronoDuration::minutes(1);
        let kind = TopicKind::OrderCreate;
        let (topic, group) = (env.names.topic(kind), env.names.group(kind));
        sqlx::query(
            "INSERT INTO dlq_messages (consumer_group, message_id, original_topic, broker_msg_id, dlq_queue_id,
                                       dlq_queue_offset, body, properties, error_class, delivery_attempts, dead_at)
             VALUES ($1, $2, $3, 'B', 0, 0, $4, $5, 'DB_TIMEOUT', 4, now())",
        )
        .bind(&group)
        .bind(m.message_id.as_str())
        .bind(&topic)
        .bind(serde_json::to_vec(&m)?)
        .bind(serde_json::json!({"TAGS": "CREATE_ORDER", "KEYS": m.reservation_id.as_str()}))
        .execute(&env.pool)
        .await?;
        let consumer =
            order_consumer(&env, ConsumerSpec::new(group.clone(), topic.clone())).await?;
        let producer = producer(&env).await?;
        let req = ReplayRequest {
            message_id: m.message_id.clone(),
            group: None,
            reason: "DB timeout fixed".into(),
            actor: seckill_tests::test_actor(),
            dry_run: false,
            force: vec![],
            verify_within: Duration::from_secs(60),
            include_replayed: false,
            retention: RETENTION,
        };
        let r = replay(&env.pool, &env.names, &producer, &req).await?;
        consumer.shutdown().await;
        producer.shutdown().await;
        let validity = r
            .checks
            .iter()
            .find(|c| c.check == Check::Validity)
            .expect("validity");
        assert_eq!(validity.level, Level::Warn, "{validity:?}");
        assert!(validity.evidence.contains("REJECTED_EXPIRED"));
        assert_eq!(
            (r.decision, r.outcome),
            (ReplayDecision::Sent, ReplayOutcome::Verified),
            "{r:#?}"
        );
        let outcome: String = sqlx::query_scalar("SELECT outcome::text FROM reservations")
            .fetch_one(&env.pool)
            .await?;
        assert_eq!(outcome, "REJECTED_EXPIRED");
        let n = |sql: &'static str| {
            let pool = env.pool.clone();
            async move { Ok::<i64, anyhow::Error>(sqlx::query_scalar(sql).fetch_one(&pool).await?) }
        };
        assert_eq!(n("SELECT count(*) FROM compensation_tasks").await?, 1);
        assert_eq!(n("SELECT count(*) FROM orders").await?, 0);
        assert_eq!(
            n("SELECT available_stock FROM inventory").await?,
            5,
            "no stock taken"
        );
        Ok(())
    });
}

/// Dead order-create entries in a new ticket of `class`, as the mirror
/// leaves them.
async fn dead_entries(
    env: &seckill_tests::TestEnv,
    class: FailureClass,
    activity: ActivityId,
    sku: SkuId,
    n: usize,
) -> anyhow::Result<(TicketId, Vec<OrderCreateRequested>)> {
    let kind = TopicKind::OrderCreate;
    let (topic, group) = (env.names.topic(kind), env.names.group(kind));
    // One live ticket per (group, class): each ticket of a test gets its own
    // class, and its own range of buyers.
    let ticket = TicketId::generate();
    let buyers = 100_000
        * FailureClass::ALL
            .iter()
            .position(|c| *c == class)
            .unwrap_or(0) as i64;
    sqlx::query(
        "INSERT INTO dlq_tickets (ticket_id, consumer_group, error_class) VALUES ($1, $2, $3)",
    )
    .bind(&ticket)
    .bind(&group)
    .bind(class)
    .execute(&env.pool)
    .await?;
    let mut out = Vec::new();
    for i in 0..n {
        let mut m = order_msg(activity, sku);
        m.user_id = UserId(1_000 + i as i64 + buyers);
        sqlx::query(
            "INSERT INTO dlq_messages (consumer_group, message_id, ticket_id, original_topic, broker_msg_id,
                                       dlq_queue_id, dlq_queue_offset, body, properties, error_class,
                                       delivery_attempts, dead_at)
             VALUES ($1, $2, $3, $4, 'B', 0, $5, $6, $7, 'DB_TIMEOUT', 4, now() + make_interval(secs => $5))",
        )
        .bind(&group)
        .bind(m.message_id.as_str())
        .bind(&ticket)
        .bind(&topic)
        .bind(i as i64)
        .bind(serde_json::to_vec(&m)?)
        .bind(serde_json::json!({"TAGS": "CREATE_ORDER", "KEYS": m.reservation_id.as_str()}))
        .execute(&env.pool)
        .await?;
        out.push(m);
    }
    Ok((ticket, out))
}

/// A producer that notes when each send leaves, for the rate check.
#[derive(Clone)]
struct Timed {
    inner: RocketProducer,
    at: Arc<std::sync::Mutex<Vec<std::time::Instant>>>,
}

impl Producer for Timed {
    async fn send(
        &self,
        msg: seckill_engine::OutgoingMessage,
        timeout: Duration,
    ) -> seckill_engine::SendOutcome {
        self.at.lock().unwrap().push(std::time::Instant::now());
        self.inner.send(msg, timeout).await
    }

    async fn send_batch(
        &self,
        msgs: Vec<seckill_engine::OutgoingMessage>,
        timeout: Duration,
    ) -> seckill_engine::SendOutcome {
        self.at.lock().unwrap().push(std::time::Instant::now());
        self.inner.send_batch(msgs, timeout).await
    }
}

#[test]
fn a_bulk_replay_keeps_to_the_rate_canaries_first_and_resumes_without_resending() {
    run(Setup::Full, |env| async move {
        let (activity, sku) = (ActivityId(8), SkuId(1));
        sqlx::query("INSERT INTO activities (activity_id, valid_for_ms, pay_within_ms) VALUES ($1, 300000, 900000)")
            .bind(activity)
            .execute(&env.pool)
            .await?;
        sqlx::query("INSERT INTO inventory (activity_id, sku_id, total_stock, available_stock) VALUES ($1, $2, 100, 100)")
            .bind(activity)
            .bind(sku)
            .execute(&env.pool)
            .await?;
        let (bulk, _) = dead_entries(&env, FailureClass::DbTimeout, activity, sku, 30).await?;
        let kind = TopicKind::OrderCreate;
        let consumer = order_consumer(
            &env,
            ConsumerSpec::new(env.names.group(kind), env.names.topic(kind)),
        )
        .await?;
        let producer = Timed {
            inner: producer(&env).await?,
            at: Default::default(),
        };
        let req = |ticket: &TicketId| BulkRequest {
            ticket: ticket.clone(),
            reason: "DB timeouts over".into(),
            actor: seckill_tests::test_actor(),
            dry_run: false,
            force: vec![],
            rate_per_s: 20.0,
            canary: 2,
            verify_within: Duration::from_secs(60),
            include_replayed: false,
            retention: RETENTION,
        };
        let r = replay_ticket(&env.pool, &env.names, &producer, &req(&bulk)).await?;
        assert_eq!((r.snapshot, r.halted.clone()), (30, None), "{r:#?}");
        assert_eq!(r.entries.len(), 30, "an outcome for every entry");
        assert!(
            r.entries
                .iter()
                .all(|e| e.outcome == ReplayOutcome::Verified),
            "{r:#?}"
        );
        let n = |sql: &'static str| {
            let pool = env.pool.clone();
            async move { Ok::<i64, anyhow::Error>(sqlx::query_scalar(sql).fetch_one(&pool).await?) }
        };
        assert_eq!(n("SELECT count(*) FROM orders").await?, 30);
        let status: String =
            sqlx::query_scalar("SELECT status::text FROM dlq_tickets WHERE ticket_id = $1")
                .bind(&bulk)
                .fetch_one(&env.pool)
                .await?;
        assert_eq!(status, "VERIFIED");
        // The rate: the pacer starts its clock once the canaries are
        // verified, so after the second canary left, and the k-th paced
        // send leaves no earlier than k/20 s after that start. Measured from
        // the second canary's send (timed at the producer), which is before
        // the pacer's start: a bound with no slack. Measuring from the first
        // paced send instead would race, as its own timestamp can be taken
        // later than the pacer's clock by however long the task waited.
        let at = producer.at.lock().unwrap().clone();
        assert_eq!(at.len(), 30);
        let (canary, sent) = (at[1], &at[2..]);
        for (k, t) in sent.iter().enumerate() {
            let since = t.duration_since(canary).as_micros() as i64;
            assert!(
                since >= k as i64 * 50_000,
                "paced send {k} came {since} µs after the last canary"
            );
        }

        // Resumed: nothing DEAD is left, nothing is sent again.
        let again = replay_ticket(&env.pool, &env.names, &producer, &req(&bulk)).await?;
        assert_eq!(
            (again.snapshot, again.skipped.len(), again.entries.len()),
            (0, 30, 0)
        );
        assert!(
            again
                .skipped
                .iter()
                .all(|k| k.done && k.reason.contains("already verified")),
            "{again:#?}"
        );
        assert_eq!(n("SELECT count(*) FROM replay_audit").await?, 30);

        // A canary that does not verify halts the run; the rest are listed, not sent.
        let (canary, dead) = dead_entries(&env, FailureClass::DbDeadlock, activity, sku, 3).await?;
        sqlx::query("INSERT INTO consumer_inbox (consumer_group, message_id, status) VALUES ($1, $2, 'SUCCEEDED')")
            .bind(env.names.group(kind))
            .bind(dead[0].message_id.as_str())
            .execute(&env.pool)
            .await?;
        let halted = replay_ticket(&env.pool, &env.names, &producer, &req(&canary)).await?;
        assert!(matches!(
            replay_ticket(
                &env.pool,
                &env.names,
                &producer,
                &req(&TicketId::generate())
            )
            .await,
            Err(ReplayError::UnknownTicket(_))
        ));
        consumer.shutdown().await;
        producer.inner.shutdown().await;
        assert!(halted.halted.is_some());
        assert_eq!(halted.entries.len(), 3);
        assert_eq!(halted.entries[0].decision, ReplayDecision::Blocked);
        assert!(
            halted.entries[1..]
                .iter()
                .all(|e| e.outcome == ReplayOutcome::NotSent && e.detail.contains("not attempted"))
        );
        assert_eq!(
            n("SELECT count(*) FROM orders").await?,
            30,
            "nothing of the halted ticket was applied"
        );
        Ok(())
    });
}

/// A minimal HTTP endpoint: records each request, answers 500 to the first
/// and 200 after, so the webhook's retry is exercised on a real socket.
async fn flaky_tracker() -> anyhow::Result<(String, Arc<std::sync::Mutex<Vec<String>>>)> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let url = format!("http://{}/tickets", listener.local_addr()?);
    let seen = Arc::new(std::sync::Mutex::new(Vec::new()));
    let log = seen.clone();
    tokio::spawn(async move {
        while let Ok((mut sock, _)) = listener.accept().await {
            let mut buf = vec![0u8; 16 * 1024];
            let mut got = 0;
            // Read until the headers and the announced body are in.
            while let Ok(n) = sock.read(&mut buf[got..]).await {
                if n == 0 {
                    break;
                }
                got += n;
                let text = String::from_utf8_lossy(&buf[..got]).to_string();
                if let Some(end) = text.find("\r\n\r\n") {
                    let len = text
                        .lines()
                        .find_map(|l| {
                            l.to_ascii_lowercase()
                                .strip_prefix("content-length:")
                                .map(|v| v.trim().parse::<usize>().unwrap_or(0))
                        })
                        .unwrap_or(0);
                    if got >= end + 4 + len {
                        break;
                    }
                }
            }
            let first = {
                let mut s = log.lock().unwrap();
                s.push(String::from_utf8_lossy(&buf[..got]).to_string());
                s.len() == 1
            };
            let status = if first {
                "500 Internal Server Error"
            } else {
                "200 OK"
            };
            let _ = sock
                .write_all(
                    format!("HTTP/1.1 {status}\r\ncontent-length: 0\r\nconnection: close\r\n\r\n")
                        .as_bytes(),
                )
                .await;
        }
    });
    Ok((url, seen))
}

#[test]
fn every_ticket_transition_is_posted_once_in_order_and_a_routed_owner_travels_with_it() {
    run(Setup::Full, |env| async move {
        let group = env.names.group(TopicKind::OrderCreate);
        sqlx::query("INSERT INTO dlq_tickets (ticket_id, consumer_group, error_class) VALUES ('tkt_hook', $1, 'DB_TIMEOUT')")
            .bind(&group)
            .execute(&env.pool)
            .await?;
        // Owner routing: DB_TIMEOUT belongs to the DBAs.
        let owners = [("DB_TIMEOUT".to_owned(), "dba".to_owned())].into();
        let routed = tickets::route_owners(&env.pool, &owners).await?;
        assert_eq!(routed.len(), 1);
        assert_eq!(routed[0].1, "dba");
        let (url, seen) = flaky_tracker().await?;
        let http = reqwest::Client::new();
        let delivered = seckill_engine::webhook::deliver_pending(&env.pool, &http, &url).await?;
        assert_eq!(delivered, 1, "the opening");
        let requests = seen.lock().unwrap().clone();
        assert_eq!(requests.len(), 2, "one failure, one retry");
        for r in &requests {
            assert!(
                r.to_ascii_lowercase()
                    .contains("idempotency-key: tkt_hook/"),
                "{r}"
            );
            assert!(
                r.contains(r#""ticket_id":"tkt_hook""#)
                    && r.contains(r#""error_class":"DB_TIMEOUT""#)
                    && r.contains(r#""from_status":null"#)
                    && r.contains(r#""status":"OPEN""#)
                    && r.contains(r#""owner":"dba""#),
                "{r}"
            );
        }
        let status: Option<String> = sqlx::query_scalar(
            "SELECT webhook_status FROM dlq_tickets WHERE ticket_id = 'tkt_hook'",
        )
        .fetch_one(&env.pool)
        .await?;
        assert_eq!(status.as_deref(), Some("DELIVERED 200"));
        // Delivered events are not posted again.
        assert_eq!(
            seckill_engine::webhook::deliver_pending(&env.pool, &http, &url).await?,
            0
        );
        // Each move is one more post, in order.
        sqlx::query("UPDATE dlq_tickets SET status = 'ACKED' WHERE ticket_id = 'tkt_hook'")
            .execute(&env.pool)
            .await?;
        sqlx::query("UPDATE dlq_tickets SET status = 'FIXED' WHERE ticket_id = 'tkt_hook'")
            .execute(&env.pool)
            .await?;
        assert_eq!(
            seckill_engine::webhook::deliver_pending(&env.pool, &http, &url).await?,
            2
        );
        let requests = seen.lock().unwrap().clone();
        assert_eq!(requests.len(), 4);
        assert!(
            requests[2].contains(r#""from_status":"OPEN""#)
                && requests[2].contains(r#""status":"ACKED""#),
            "{}",
            requests[2]
        );
        assert!(
            requests[3].contains(r#""from_status":"ACKED""#)
                && requests[3].contains(r#""status":"FIXED""#),
            "{}",
            requests[3]
        );
        Ok(())
    });
}

/// What the TUI shows on drill-down: the pre-check verdicts of a dead
/// message, read-only (no audit row, nothing sent), and the same verdicts
/// a dry run records.
#[test]
fn prechecks_are_read_only_and_match_the_dry_run() {
    run(Setup::Full, |env| async move {
        let (activity, sku) = (ActivityId(8), SkuId(1));
        env.seed_activity(activity, sku, 5, 300_000).await?;
        let (_, dead) = dead_entries(&env, FailureClass::DbDeadlock, activity, sku, 1).await?;
        let id = dead[0].message_id.clone();
        let group = env.names.group(TopicKind::OrderCreate);
        let checks =
            seckill_engine::replay::precheck(&env.pool, &env.names, &group, &id, RETENTION).await?;
        let audits: i64 = sqlx::query_scalar("SELECT count(*) FROM replay_audit")
            .fetch_one(&env.pool)
            .await?;
        assert_eq!(audits, 0, "a pre-check writes nothing");
        assert!(!checks.is_empty());
        assert!(
            checks
                .iter()
                .all(|v| v.level != seckill_engine::CheckLevel::Block),
            "{checks:?}"
        );
        let unknown = seckill_engine::replay::precheck(
            &env.pool,
            &env.names,
            &group,
            &MessageId::generate(),
            RETENTION,
        )
        .await;
        assert!(
            unknown.is_err(),
            "an unknown message is an error, not an empty verdict"
        );

        let p = producer(&env).await?;
        let report = seckill_engine::replay::replay(
            &env.pool,
            &env.names,
            &p,
            &seckill_engine::ReplayRequest {
                message_id: id.clone(),
                group: Some(group.clone()),
                reason: "compare".into(),
                actor: seckill_tests::test_actor(),
                dry_run: true,
                force: vec![],
                verify_within: Duration::from_secs(1),
                include_replayed: false,
                retention: RETENTION,
            },
        )
        .await?;
        p.shutdown().await;
        let strip = |v: &[seckill_engine::Verdict]| -> Vec<(String, String)> {
            v.iter()
                .map(|v| (v.check.as_str().to_owned(), format!("{:?}", v.level)))
                .collect()
        };
        assert_eq!(strip(&report.checks), strip(&checks));
        Ok(())
    });
}

/// The activity, its stock and a trigger that refuses `user`'s order: a
/// poison only PostgreSQL can cure (dropping the trigger is the fix).
async fn poisoned(
    env: &seckill_tests::TestEnv,
    activity: ActivityId,
    sku: SkuId,
    user: i64,
) -> anyhow::Result<()> {
    sqlx::query("INSERT INTO activities (activity_id, valid_for_ms, pay_within_ms) VALUES ($1, 300000, 900000)")
        .bind(activity)
        .execute(&env.pool)
        .await?;
    sqlx::query("INSERT INTO inventory (activity_id, sku_id, total_stock, available_stock) VALUES ($1, $2, 5, 5)")
        .bind(activity)
        .bind(sku)
        .execute(&env.pool)
        .await?;
    sqlx::raw_sql(&format!(
        "CREATE FUNCTION poison() RETURNS trigger LANGUAGE plpgsql AS $$
         BEGIN
           IF NEW.user_id = {user} THEN RAISE EXCEPTION 'poison: user % refused', NEW.user_id; END IF;
           RETURN NEW;
         END $$;
         CREATE TRIGGER poison BEFORE INSERT ON orders FOR EACH ROW EXECUTE FUNCTION poison();"
    ))
    .execute(&env.pool)
    .await?;
    Ok(())
}

/// Mirrors until the entry is in `status`.
async fn entry_becomes(
    env: &seckill_tests::TestEnv,
    group: &str,
    id: &MessageId,
    status: DlqEntryStatus,
) -> anyhow::Result<seckill_engine::DlqEntry> {
    eventually(
        Duration::from_secs(120),
        &format!("entry {id} {status}"),
        || async {
            mirror_once(&env.admin, &env.pool, &env.names).await?;
            let entries = tickets::list_entries(&env.pool, Some(group), None, None).await?;
            Ok(entries
                .into_iter()
                .find(|e| e.message_id == DlqEntryKey::Message(id.clone()) && e.status == status))
        },
    )
    .await
}

/// A message on its way to the DLQ: user 1's order is refused by a
/// trigger, and its consumer gives up after one retry.
struct Dying {
    group: String,
    consumer: RocketConsumer,
    producer: RocketProducer,
    m: OrderCreateRequested,
}

async fn dying(
    env: &seckill_tests::TestEnv,
    activity: ActivityId,
    sku: SkuId,
) -> anyhow::Result<Dying> {
    poisoned(env, activity, sku, 1).await?;
    let kind = TopicKind::OrderCreate;
    let (topic, group) = (env.names.topic(kind), env.names.group(kind));
    env.admin.ensure_group(&group, 1).await?;
    let mut spec = ConsumerSpec::new(group.clone(), topic.clone());
    spec.max_reconsume_times = 1;
    let consumer = order_consumer(env, spec).await?;
    let producer = producer(env).await?;
    let m = order_msg(activity, sku);
    let sent = producer
        .send(to_outgoing(&m, &topic), Duration::from_secs(3))
        .await;
    ensure!(sent.is_confirmed(), "{sent:?}");
    Ok(Dying {
        group,
        consumer,
        producer,
        m,
    })
}

#[test]
fn an_entry_dies_again_after_a_failed_replay_then_a_ticket_replay_verifies_it_and_the_ticket() {
    run(Setup::Full, |env| async move {
        let (activity, sku) = (ActivityId(17), SkuId(3));
        let Dying {
            group,
            consumer,
            producer,
            m,
        } = dying(&env, activity, sku).await?;
        let id = m.message_id.clone();
        let dead = entry_becomes(&env, &group, &id, DlqEntryStatus::Dead).await?;
        let ticket = dead.ticket_id.clone().expect("ticketed");

        // A rehearsal before the fix shows the error the replay would hit.
        let rehearsal = seckill_engine::replay::rehearse(&env.pool, &env.names, &id, None).await?;
        match &rehearsal.verdict {
            seckill_engine::replay::RehearsedVerdict::Fails(e) => {
                assert!(e.contains("poison: user 1 refused"), "{e}")
            }
            other => panic!("{other:?}"),
        }

        // Before the fix: the replayed copy fails, is not verified in time
        // (REPLAYED), then dies again and is DEAD again, its count kept.
        let req = |reason: &str, within: u64, include_replayed: bool| ReplayRequest {
            message_id: id.clone(),
            group: None,
            reason: reason.into(),
            actor: seckill_tests::test_actor(),
            dry_run: false,
            force: vec![],
            verify_within: Duration::from_secs(within),
            include_replayed,
            retention: RETENTION,
        };
        let early = replay(&env.pool, &env.names, &producer, &req("try it", 3, false)).await?;
        assert_eq!(
            (early.decision, early.outcome),
            (ReplayDecision::Sent, ReplayOutcome::VerifyFailed),
            "{early:#?}"
        );
        let again = entry_becomes(&env, &group, &id, DlqEntryStatus::Dead).await?;
        assert_eq!(again.replay_count, 1, "the count survives the second death");
        let t = tickets::get_ticket(&env.pool, &ticket)
            .await?
            .expect("ticket");
        assert_ne!(t.status, TicketStatus::Verified);

        // A ticket with a dead entry closes only with --force.
        let close = |force| TicketAction::Close {
            resolution: "done".into(),
            force,
        };
        assert!(matches!(
            tickets::apply(
                &env.pool,
                &ticket,
                &close(false),
                &seckill_tests::test_actor()
            )
            .await,
            Err(ApplyError::Ticket(TicketError::Unsettled {
                unsettled: 1,
                ..
            }))
        ));

        // The fix; a rehearsal shows the exact order, and keeps nothing.
        sqlx::raw_sql("DROP TRIGGER poison ON orders")
            .execute(&env.pool)
            .await?;
        let rehearsal = seckill_engine::replay::rehearse(&env.pool, &env.names, &id, None).await?;
        assert_eq!(
            rehearsal.verdict,
            seckill_engine::replay::RehearsedVerdict::Created(m.order_id.clone())
        );
        let order = rehearsal.order.clone().expect("the order it would create");
        assert_eq!(order.order_id, m.order_id);
        assert_eq!(rehearsal.stock, Some((sku, 5, 4)));
        assert_eq!(rehearsal.ledger.len(), 1);
        assert_eq!(rehearsal.ledger[0].delta, -1);
        let tags: Vec<&str> = rehearsal.outbox.iter().map(|o| o.tag.as_str()).collect();
        assert!(
            tags.contains(&"CANCEL_IF_UNPAID") && tags.contains(&"ORDER_CREATED"),
            "{tags:?}"
        );
        let kept: (i64, i64, i64) = sqlx::query_as(
            "SELECT (SELECT count(*) FROM orders), (SELECT available_stock FROM inventory),
                    (SELECT count(*) FROM event_outbox)",
        )
        .fetch_one(&env.pool)
        .await?;
        assert_eq!(kept, (0, 5, 0), "a rehearsal keeps nothing");

        // Then a ticket replay: verified, and the ticket with it.
        let bulk = replay_ticket(
            &env.pool,
            &env.names,
            &producer,
            &BulkRequest {
                ticket: ticket.clone(),
                reason: "trigger dropped".into(),
                actor: seckill_tests::test_actor(),
                dry_run: false,
                force: vec![],
                rate_per_s: 10.0,
                canary: 1,
                verify_within: Duration::from_secs(60),
                include_replayed: false,
                retention: RETENTION,
            },
        )
        .await?;
        assert_eq!(bulk.entries.len(), 1, "{bulk:#?}");
        assert_eq!(bulk.entries[0].outcome, ReplayOutcome::Verified);
        let t = tickets::get_ticket(&env.pool, &ticket)
            .await?
            .expect("ticket");
        assert_eq!((t.status, t.dead), (TicketStatus::Verified, 0));
        let created: (i64, OrderId) =
            sqlx::query_as("SELECT count(*) OVER (), order_id FROM orders")
                .fetch_one(&env.pool)
                .await?;
        assert_eq!(
            created,
            (1, order.order_id),
            "the order the rehearsal showed"
        );

        // A second replay is refused, with its reason.
        let second = replay(&env.pool, &env.names, &producer, &req("again", 3, true)).await?;
        assert_eq!(second.decision, ReplayDecision::Blocked);
        assert!(second.detail.contains("already verified"), "{second:#?}");
        let t = tickets::apply(
            &env.pool,
            &ticket,
            &close(false),
            &seckill_tests::test_actor(),
        )
        .await?;
        assert_eq!(t.status, TicketStatus::Closed);
        consumer.shutdown().await;
        producer.shutdown().await;
        Ok(())
    });
}

#[test]
fn the_verifier_verifies_an_entry_whoever_applied_it_and_reopens_a_verified_ticket() {
    run(Setup::Full, |env| async move {
        let (activity, sku) = (ActivityId(18), SkuId(4));
        sqlx::query("INSERT INTO activities (activity_id, valid_for_ms, pay_within_ms) VALUES ($1, 300000, 900000)")
            .bind(activity)
            .execute(&env.pool)
            .await?;
        sqlx::query("INSERT INTO inventory (activity_id, sku_id, total_stock, available_stock) VALUES ($1, $2, 50, 50)")
            .bind(activity)
            .bind(sku)
            .execute(&env.pool)
            .await?;
        let (ticket, msgs) =
            dead_entries(&env, FailureClass::DbPoolExhausted, activity, sku, 2).await?;
        let verify = || seckill_engine::verifier::verify_once(&env.pool, &env.names);
        let none = verify().await?;
        assert!(none.verified.is_empty(), "nothing applied yet: {none:?}");

        // The same message_id applied outside any replay (the broker's
        // redelivery, the scanner's re-send): the verifier sees the effect.
        let kind = TopicKind::OrderCreate;
        let (topic, group) = (env.names.topic(kind), env.names.group(kind));
        let consumer =
            order_consumer(&env, ConsumerSpec::new(group.clone(), topic.clone())).await?;
        let producer = producer(&env).await?;
        for m in &msgs {
            let sent = producer
                .send(to_outgoing(m, &topic), Duration::from_secs(3))
                .await;
            ensure!(sent.is_confirmed(), "{sent:?}");
        }
        let report = eventually(Duration::from_secs(60), "both verified", || async {
            let _ = verify().await?;
            let t = tickets::get_ticket(&env.pool, &ticket)
                .await?
                .expect("ticket");
            Ok((t.status == TicketStatus::Verified).then_some(t))
        })
        .await?;
        assert_eq!((report.messages, report.dead), (2, 0));
        let entries = tickets::list_entries(&env.pool, None, Some(&ticket), None).await?;
        assert!(
            entries
                .iter()
                .all(|e| e.status == DlqEntryStatus::Verified && e.verified_at.is_some())
        );

        // A new entry of its class reopens it, owner kept.
        tickets::apply(
            &env.pool,
            &ticket,
            &TicketAction::Assign {
                owner: "bob".into(),
            },
            &seckill_tests::test_actor(),
        )
        .await?;
        let m = order_msg(activity, sku);
        sqlx::query(
            "INSERT INTO dlq_messages (consumer_group, message_id, ticket_id, original_topic, broker_msg_id,
                                       dlq_queue_id, dlq_queue_offset, body, properties, error_class,
                                       delivery_attempts, dead_at)
             VALUES ($1, $2, $3, $4, 'B', 0, 99, $5, '{}', 'DB_POOL_EXHAUSTED', 4, now())",
        )
        .bind(&group)
        .bind(m.message_id.as_str())
        .bind(&ticket)
        .bind(&topic)
        .bind(serde_json::to_vec(&m)?)
        .execute(&env.pool)
        .await?;
        let r = verify().await?;
        assert_eq!(r.tickets_reopened, vec![ticket.clone()]);
        let t = tickets::get_ticket(&env.pool, &ticket)
            .await?
            .expect("ticket");
        assert_eq!(
            (t.status, t.owner.as_deref()),
            (TicketStatus::Open, Some("bob"))
        );
        consumer.shutdown().await;
        producer.shutdown().await;
        Ok(())
    });
}

#[test]
fn a_discard_is_fenced_compensates_an_order_message_once_and_is_audited() {
    run(Setup::Full, |env| async move {
        let (activity, sku) = (ActivityId(19), SkuId(5));
        sqlx::query("INSERT INTO activities (activity_id, valid_for_ms, pay_within_ms) VALUES ($1, 300000, 900000)")
            .bind(activity)
            .execute(&env.pool)
            .await?;
        sqlx::query("INSERT INTO inventory (activity_id, sku_id, total_stock, available_stock) VALUES ($1, $2, 9, 9)")
            .bind(activity)
            .bind(sku)
            .execute(&env.pool)
            .await?;
        let (ticket, msgs) = dead_entries(&env, FailureClass::Unknown, activity, sku, 1).await?;
        let m = &msgs[0];
        let req = |reason: &str| seckill_engine::DiscardRequest {
            message_id: m.message_id.clone(),
            group: None,
            reason: reason.into(),
            actor: seckill_tests::test_actor(),
        };
        assert!(matches!(
            seckill_engine::discard(&env.pool, &env.names, &req(" ")).await,
            Err(seckill_engine::DiscardError::NoReason)
        ));
        let r = seckill_engine::discard(&env.pool, &env.names, &req("poison for good")).await?;
        assert!(r.compensated, "{r:?}");
        let audited = env.audit_of(m.message_id.as_str()).await?;
        assert_eq!(audited.len(), 1, "{audited:?}");
        assert_eq!(audited[0].command, "dlq discard");
        assert_eq!(audited[0].reason.as_deref(), Some("poison for good"));
        assert_eq!(
            audited[0].after.as_ref().map(|a| a["compensated"].clone()),
            Some(true.into())
        );
        let n = |sql: &'static str| {
            let pool = env.pool.clone();
            async move { Ok::<i64, anyhow::Error>(sqlx::query_scalar(sql).fetch_one(&pool).await?) }
        };
        assert_eq!(
            n("SELECT count(*) FROM reservations WHERE outcome = 'RELEASED'").await?,
            1
        );
        assert_eq!(
            n("SELECT count(*) FROM compensation_tasks WHERE source = 'BUSINESS_REJECTION'")
                .await?,
            1
        );
        assert_eq!(
            n("SELECT count(*) FROM consumer_inbox WHERE result_code = 'DISCARDED'").await?,
            1
        );
        assert_eq!(
            n("SELECT count(*) FROM replay_audit WHERE decision = 'DISCARDED'").await?,
            1
        );
        let e = &tickets::list_entries(&env.pool, None, Some(&ticket), None).await?[0];
        assert_eq!(e.status, DlqEntryStatus::Discarded);
        let t = tickets::get_ticket(&env.pool, &ticket)
            .await?
            .expect("ticket");
        assert_eq!(t.status, TicketStatus::Verified, "every entry settled");
        // Twice: refused, nothing written again.
        assert!(matches!(
            seckill_engine::discard(&env.pool, &env.names, &req("again")).await,
            Err(seckill_engine::DiscardError::Refused { .. })
        ));
        // A copy still on its way (the broker's retry) is a no-op: never
        // both an order and a compensation.
        let kind = TopicKind::OrderCreate;
        let (topic, group) = (env.names.topic(kind), env.names.group(kind));
        let consumer =
            order_consumer(&env, ConsumerSpec::new(group.clone(), topic.clone())).await?;
        let producer = producer(&env).await?;
        let marker = order_msg(activity, sku);
        for msg in [m, &marker] {
            let sent = producer
                .send(to_outgoing(msg, &topic), Duration::from_secs(3))
                .await;
            ensure!(sent.is_confirmed(), "{sent:?}");
        }
        // Both consumed (the group's lag is 0, offsets committed), and only
        // the marker made an order.
        eventually(Duration::from_secs(60), "both consumed", || async {
            let lag = env.admin.lag(&topic, &group).await?;
            let orders = n("SELECT count(*) FROM orders").await?;
            Ok((lag.messages == 0 && orders >= 1).then_some(()))
        })
        .await?;
        assert_eq!(n("SELECT count(*) FROM orders").await?, 1);
        let order_user: i64 = sqlx::query_scalar("SELECT user_id FROM orders")
            .fetch_one(&env.pool)
            .await?;
        assert_eq!(
            order_user, marker.user_id.0,
            "no order for the discarded message"
        );
        consumer.shutdown().await;
        producer.shutdown().await;
        Ok(())
    });
}

#[test]
fn two_operators_replaying_one_ticket_at_once_send_each_entry_once() {
    run(Setup::Full, |env| async move {
        let (activity, sku) = (ActivityId(20), SkuId(6));
        sqlx::query("INSERT INTO activities (activity_id, valid_for_ms, pay_within_ms) VALUES ($1, 300000, 900000)")
            .bind(activity)
            .execute(&env.pool)
            .await?;
        sqlx::query("INSERT INTO inventory (activity_id, sku_id, total_stock, available_stock) VALUES ($1, $2, 50, 50)")
            .bind(activity)
            .bind(sku)
            .execute(&env.pool)
            .await?;
        const N: usize = 10;
        let (ticket, _) =
            dead_entries(&env, FailureClass::DbSerialization, activity, sku, N).await?;
        let kind = TopicKind::OrderCreate;
        let consumer = order_consumer(
            &env,
            ConsumerSpec::new(env.names.group(kind), env.names.topic(kind)),
        )
        .await?;
        let producer = Timed {
            inner: producer(&env).await?,
            at: Default::default(),
        };
        let req = |operator: &str| BulkRequest {
            ticket: ticket.clone(),
            reason: "serialization storm over".into(),
            actor: seckill_engine::Actor {
                name: operator.into(),
                ..seckill_tests::test_actor()
            },
            dry_run: false,
            force: vec![],
            rate_per_s: 50.0,
            canary: 1,
            verify_within: Duration::from_secs(60),
            include_replayed: false,
            retention: RETENTION,
        };
        let (alice, bob) = (req("alice"), req("bob"));
        let (a, b) = tokio::join!(
            replay_ticket(&env.pool, &env.names, &producer, &alice),
            replay_ticket(&env.pool, &env.names, &producer, &bob),
        );
        let (a, b) = (a?, b?);
        consumer.shutdown().await;
        producer.inner.shutdown().await;
        assert_eq!(
            producer.at.lock().unwrap().len(),
            N,
            "each entry sent once: {a:#?} {b:#?}"
        );
        let sent = |r: &seckill_engine::BulkReport| {
            r.entries
                .iter()
                .filter(|e| e.decision == ReplayDecision::Sent)
                .count()
        };
        assert_eq!(sent(&a) + sent(&b), N);
        let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders")
            .fetch_one(&env.pool)
            .await?;
        assert_eq!(orders, N as i64);
        // The verifier settles whatever either run left REPLAYED.
        seckill_engine::verifier::verify_once(&env.pool, &env.names).await?;
        let t = tickets::get_ticket(&env.pool, &ticket)
            .await?
            .expect("ticket");
        assert_eq!((t.status, t.dead), (TicketStatus::Verified, 0), "{t:?}");
        Ok(())
    });
}

/// docs/architecture.md §13.5 (the drill table): a replay of a message while the broker
/// redelivers the same message. 50 rounds at once: each message fails its
/// first delivery (a gate refuses every order), the broker schedules its
/// redelivery (about 10 s later), and meanwhile the gate opens and an
/// operator replays the ticket, spread over 15 s so the replays and the
/// redeliveries overlap. Exactly one business effect per message.
#[test]
fn a_replay_racing_the_brokers_redelivery_has_one_effect_50_rounds() {
    run(Setup::Full, |env| async move {
        let (activity, sku) = (ActivityId(21), SkuId(7));
        sqlx::query("INSERT INTO activities (activity_id, valid_for_ms, pay_within_ms) VALUES ($1, 300000, 900000)")
            .bind(activity)
            .execute(&env.pool)
            .await?;
        sqlx::query("INSERT INTO inventory (activity_id, sku_id, total_stock, available_stock) VALUES ($1, $2, 100, 100)")
            .bind(activity)
            .bind(sku)
            .execute(&env.pool)
            .await?;
        sqlx::raw_sql(
            "CREATE TABLE gate (closed boolean NOT NULL); INSERT INTO gate VALUES (true);
             CREATE FUNCTION gate() RETURNS trigger LANGUAGE plpgsql AS $$
             BEGIN
               IF (SELECT closed FROM gate) THEN RAISE EXCEPTION 'gate closed'; END IF;
               RETURN NEW;
             END $$;
             CREATE TRIGGER gate BEFORE INSERT ON orders FOR EACH ROW EXECUTE FUNCTION gate();",
        )
        .execute(&env.pool)
        .await?;
        const N: usize = 50;
        let kind = TopicKind::OrderCreate;
        let (topic, group) = (env.names.topic(kind), env.names.group(kind));
        env.admin.ensure_group(&group, 5).await?;
        let mut spec = ConsumerSpec::new(group.clone(), topic.clone());
        spec.max_reconsume_times = 5;
        // One message per batch: a batch failing on the gate retries alone.
        spec.batch_max = 1;
        let consumer = order_consumer(&env, spec).await?;
        let producer = producer(&env).await?;
        // The messages, mirrored as dead under one ticket as the governor
        // would have (they are in the retry topic, not yet dead: the race).
        let (ticket, msgs) = dead_entries(&env, FailureClass::DbTimeout, activity, sku, N).await?;
        for m in &msgs {
            let sent = producer
                .send(to_outgoing(m, &topic), Duration::from_secs(3))
                .await;
            ensure!(sent.is_confirmed(), "{sent:?}");
        }
        eventually(Duration::from_secs(60), "every first delivery failed", || async {
            let failed: i64 = sqlx::query_scalar(
                "SELECT count(DISTINCT message_id) FROM consumer_failures WHERE consumer_group = $1",
            )
            .bind(&group)
            .fetch_one(&env.pool)
            .await?;
            Ok((failed as usize >= N).then_some(()))
        })
        .await?;
        sqlx::query("UPDATE gate SET closed = false")
            .execute(&env.pool)
            .await?;
        let report = replay_ticket(
            &env.pool,
            &env.names,
            &producer,
            &BulkRequest {
                ticket: ticket.clone(),
                reason: "gate open".into(),
                actor: seckill_tests::test_actor(),
                dry_run: false,
                force: vec![],
                rate_per_s: N as f64 / 15.0,
                canary: 0,
                verify_within: Duration::from_secs(90),
                include_replayed: false,
                retention: RETENTION,
            },
        )
        .await?;
        // Both copies are decided: every message has its effect once.
        let n = |sql: &'static str| {
            let pool = env.pool.clone();
            async move { Ok::<i64, anyhow::Error>(sqlx::query_scalar(sql).fetch_one(&pool).await?) }
        };
        eventually(
            Duration::from_secs(90),
            "every redelivery consumed",
            || async {
                let lag = env.admin.lag(&topic, &group).await?;
                let retry = env
                    .admin
                    .lag(&seckill_engine::retry_topic(&group), &group)
                    .await
                    .map(|l| l.messages)
                    .unwrap_or(0);
                Ok((lag.messages == 0 && retry == 0).then_some(()))
            },
        )
        .await?;
        consumer.shutdown().await;
        producer.shutdown().await;
        assert_eq!(
            n("SELECT count(*) FROM orders").await?,
            N as i64,
            "{report:#?}"
        );
        assert_eq!(
            n("SELECT count(*) FROM inventory_ledger").await?,
            N as i64,
            "one stock movement per message"
        );
        assert_eq!(
            n("SELECT available_stock FROM inventory").await?,
            100 - N as i64
        );
        assert_eq!(
            n("SELECT count(*) FROM consumer_inbox WHERE status = 'SUCCEEDED'").await?,
            N as i64
        );
        assert_eq!(n("SELECT count(*) FROM compensation_tasks").await?, 0);
        Ok(())
    });
}

/// `seckillctl trace` of a replayed message (docs/architecture.md §11.6):
/// BROKEN while its message is dead with no effect, CONSISTENT once the
/// replay created the order, with the death, the replay and the order on
/// one timeline, found by the message id alone.
#[test]
fn trace_tells_a_dead_message_then_its_replay() {
    run(Setup::Full, |env| async move {
        let (activity, sku) = (ActivityId(18), SkuId(3));
        let Dying {
            group,
            consumer,
            producer,
            m,
        } = dying(&env, activity, sku).await?;
        let id = m.message_id.clone();
        entry_becomes(&env, &group, &id, DlqEntryStatus::Dead).await?;
        let anchor = TraceAnchor::Message(id.clone());
        let events = |s: &seckill_engine::Story| -> Vec<String> {
            s.lines
                .iter()
                .map(|l| format!("{} {}", l.source, l.event))
                .collect()
        };

        let store = env.store();
        let sources = TraceSources {
            pool: &env.pool,
            store: &store,
            broker: Some((&env.admin, &env.names)),
        };
        let dead = trace_story(&sources, &anchor, id.as_str()).await?;
        assert_eq!(dead.verdict, StoryVerdict::Broken, "{dead:#?}");
        assert!(dead.reason.contains("DLQ"), "{}", dead.reason);
        assert_eq!(dead.reservation_id, m.reservation_id);
        assert!(
            events(&dead).contains(&"broker dead-lettered".to_owned()),
            "{dead:#?}"
        );

        sqlx::raw_sql("DROP TRIGGER poison ON orders")
            .execute(&env.pool)
            .await?;
        let done = replay(
            &env.pool,
            &env.names,
            &producer,
            &ReplayRequest {
                message_id: id.clone(),
                group: None,
                reason: "trigger dropped".into(),
                actor: seckill_tests::test_actor(),
                dry_run: false,
                force: vec![],
                verify_within: Duration::from_secs(60),
                include_replayed: false,
                retention: RETENTION,
            },
        )
        .await?;
        assert_eq!(done.outcome, ReplayOutcome::Verified, "{done:#?}");
        let replayed = trace_story(&sources, &anchor, id.as_str()).await?;
        assert_eq!(replayed.verdict, StoryVerdict::Consistent, "{replayed:#?}");
        let seen = events(&replayed);
        for want in [
            "broker dead-lettered",
            "postgresql replay",
            "postgresql order created",
            "postgresql consumed",
        ] {
            assert!(seen.iter().any(|e| e == want), "no {want:?} in {seen:?}");
        }
        // The replay's consumption comes after the death on the timeline.
        let at = |what: &str| seen.iter().position(|e| e == what);
        assert!(
            at("broker dead-lettered") < at("postgresql order created"),
            "{seen:?}"
        );
        consumer.shutdown().await;
        producer.shutdown().await;
        Ok(())
    });
}
