//! Ending a sale and retiring it (docs/architecture.md §16.3): after
//! `activity end` every engine answers 410 ACTIVITY_ENDED to new requests
//! while a retried `request_id` still gets its reservation; once every
//! order is decided and nothing waits for its send, the sweeps' pass takes
//! the activity out of Redis: the epoch goes (a late reserve gets
//! `NoEpoch`), the keys expire, the scanner's set and the Redis-state watch
//! leave it out, and a restore is refused.

use anyhow::{Result, ensure};
use seckill_engine::{
    ActivityError, ActivityId, NewActivity, RedisStateError, RestoreRequest, RetireOutcome, SkuId,
    activity, redis_state,
};
use seckill_tests::{Engine, Setup, TestEnv, eventually, reserve_request, run, test_actor};
use std::time::Duration;

const SKU: SkuId = SkuId(1);

async fn seed(env: &TestEnv, activity_id: ActivityId, stock: i64) -> Result<()> {
    activity::create(
        &env.pool,
        &env.store(),
        &NewActivity {
            activity: activity_id,
            sku: SKU,
            stock,
            valid_for_ms: 300_000,
            pay_within_ms: 900_000,
            force: false,
        },
    )
    .await?;
    Ok(())
}

async fn reserve(
    engine: &Engine,
    activity: ActivityId,
    user: i64,
    request_id: &str,
) -> Result<(u16, serde_json::Value)> {
    let r = engine
        .http
        .post(format!(
            "http://{}/v1/activities/{activity}/skus/{SKU}/reservations",
            engine.addr
        ))
        .json(&serde_json::json!({ "user_id": user, "request_id": request_id }))
        .send()
        .await?;
    Ok((r.status().as_u16(), r.json().await.unwrap_or_default()))
}

#[test]
fn an_ended_sale_refuses_new_requests_and_answers_retries() {
    run(Setup::Full, |env| async move {
        const A: ActivityId = ActivityId(41);
        seed(&env, A, 10).await?;
        let engine = Engine::start(&env, env.cfg.clone()).await?;
        let first = seckill_engine::RequestId::generate();
        let (code, before) = reserve(&engine, A, 1, first.as_str()).await?;
        ensure!(code == 202, "{code} {before}");

        let ended =
            activity::end_audited(&env.pool, A, Duration::ZERO, "sale over", &test_actor()).await?;
        assert!(!ended.already_ended);
        // Within FACTS_FRESH every new request is refused, for good.
        let refused = eventually(Duration::from_secs(15), "410 ACTIVITY_ENDED", || async {
            let (code, body) = reserve(
                &engine,
                A,
                2,
                seckill_engine::RequestId::generate().as_str(),
            )
            .await?;
            Ok((code == 410).then_some(body))
        })
        .await?;
        assert_eq!(refused["error"], "ACTIVITY_ENDED", "{refused}");
        // The same request_id is a retry of a request made before the end.
        let (code, again) = reserve(&engine, A, 1, first.as_str()).await?;
        assert_eq!(code, 202, "{again}");
        assert_eq!(again["reservation_id"], before["reservation_id"]);

        // An end never moves later, and an ended sale is never seeded again.
        let later = activity::end_audited(
            &env.pool,
            A,
            Duration::from_secs(3600),
            "again",
            &test_actor(),
        )
        .await?;
        assert!(later.already_ended);
        assert_eq!(later.ends_at, ended.ends_at);
        let reseed = activity::create(
            &env.pool,
            &env.store(),
            &NewActivity {
                activity: A,
                sku: SkuId(2),
                stock: 5,
                valid_for_ms: 300_000,
                pay_within_ms: 900_000,
                force: false,
            },
        )
        .await;
        assert!(
            matches!(reseed, Err(ActivityError::Ended { .. })),
            "{reseed:?}"
        );
        // A blank reason is refused before anything is written.
        let blank = activity::end_audited(&env.pool, A, Duration::ZERO, " ", &test_actor()).await;
        assert!(
            matches!(blank, Err(ActivityError::EndNeedsReason)),
            "{blank:?}"
        );
        let audited = env.audit_of(&A.to_string()).await?;
        assert_eq!(
            audited
                .iter()
                .filter(|r| r.command == "activity end")
                .count(),
            2,
            "{audited:?}"
        );
        engine.stop().await
    });
}

#[test]
fn retirement_waits_for_sends_and_orders_then_fences_redis() {
    run(Setup::Full, |env| async move {
        const A: ActivityId = ActivityId(42);
        let store = env.store();
        seed(&env, A, 10).await?;
        let now = chrono::Utc::now().timestamp_millis();
        let waiting = reserve_request(A, SKU, 7, now, 300_000);
        store.reserve(&waiting, now + 600_000).await?;

        // Not ended: never retired.
        assert!(
            activity::retire_due(&env.pool, &store, 10)
                .await?
                .is_empty()
        );
        // Ended long enough ago that validity and the grace have passed.
        sqlx::query(
            "UPDATE activities SET ends_at = now() - interval '1 hour' WHERE activity_id = $1",
        )
        .bind(A)
        .execute(&env.pool)
        .await?;

        // A reservation still waits for its send: the script says so.
        let pass = activity::retire_due(&env.pool, &store, 10).await?;
        assert_eq!(pass.len(), 1, "{pass:?}");
        assert_eq!(pass[0].outcome, RetireOutcome::Pending(1));
        assert_eq!(
            redis_state::survey_one(&env.pool, &store, A)
                .await?
                .map(|s| s.redis_epoch.is_some()),
            Some(true)
        );

        // Sent, but its order is unpaid: its cancel still owes Redis a unit.
        store
            .mark_sent(A, &waiting.reservation_id, &waiting.message_id, "B1")
            .await?;
        sqlx::query(
            "INSERT INTO orders (order_id, reservation_id, request_id, activity_id, sku_id, user_id, quantity, expires_at)
             VALUES ($1, $2, $3, $4, $5, 7, 1, now() + interval '15 minutes')",
        )
        .bind(waiting.order_id.as_str())
        .bind(waiting.reservation_id.as_str())
        .bind(waiting.request_id.as_str())
        .bind(A)
        .bind(SKU)
        .execute(&env.pool)
        .await?;
        assert!(
            activity::retire_due(&env.pool, &store, 10)
                .await?
                .is_empty()
        );
        sqlx::query("UPDATE orders SET status = 'PAID', paid_at = now() WHERE activity_id = $1")
            .bind(A)
            .execute(&env.pool)
            .await?;

        let pass = activity::retire_due(&env.pool, &store, 10).await?;
        assert_eq!(pass.len(), 1, "{pass:?}");
        assert_eq!(pass[0].outcome, RetireOutcome::Retired);
        // Stamped: the next pass finds nothing.
        assert!(
            activity::retire_due(&env.pool, &store, 10)
                .await?
                .is_empty()
        );
        let view = activity::show(&env.pool, &store, A).await?;
        assert!(view.retired_at.is_some(), "{view:?}");

        // The fence: an engine that still believes the sale open admits nothing.
        let late = reserve_request(A, SKU, 8, now, 300_000);
        assert_eq!(
            store.reserve(&late, now + 600_000).await?,
            seckill_engine::ReserveOutcome::NoEpoch
        );
        // The keys expire within a day; the scanner's set no longer has it.
        let mut redis = env.redis.clone();
        let keys = store.keys(A);
        for key in [keys.stock(SKU), keys.buyers()] {
            let ttl: i64 = redis::cmd("PTTL").arg(&key).query_async(&mut redis).await?;
            ensure!(ttl > 0 && ttl <= 24 * 3600 * 1000, "{key}: PTTL {ttl}");
        }
        assert!(!store.activities().await?.contains(&A));
        // The Redis-state watch leaves it out, and a restore is refused.
        let live = redis_state::survey(&env.pool, &store).await?;
        assert!(live.iter().all(|s| s.activity_id != A), "{live:?}");
        let restore = seckill_engine::restore_audited(
            &seckill_engine::RestoreOn {
                pool: &env.pool,
                store: &store,
                admin: &env.admin,
                names: &env.names,
            },
            &RestoreRequest {
                activity: A,
                operator: "test".into(),
                reason: "try".into(),
            },
            &test_actor(),
            Duration::from_secs(1),
            &|_| {},
        )
        .await;
        assert!(
            matches!(
                restore,
                Err(seckill_engine::RestoreError::State(
                    RedisStateError::Retired(_)
                ))
            ),
            "{restore:?}"
        );
        Ok(())
    });
}

#[test]
fn a_release_never_recreates_an_expired_stock_key() {
    run(Setup::Full, |env| async move {
        const A: ActivityId = ActivityId(43);
        let store = env.store();
        seed(&env, A, 3).await?;
        let now = chrono::Utc::now().timestamp_millis();
        let r = reserve_request(A, SKU, 9, now, 300_000);
        store.reserve(&r, now + 600_000).await?;
        let mut redis = env.redis.clone();
        let stock_key = store.keys(A).stock(SKU);
        let _: i64 = redis::cmd("DEL")
            .arg(&stock_key)
            .query_async(&mut redis)
            .await?;
        assert_eq!(
            store.release(A, &r.reservation_id).await?,
            seckill_engine::ReleaseOutcome::Unknown
        );
        let exists: i64 = redis::cmd("EXISTS")
            .arg(&stock_key)
            .query_async(&mut redis)
            .await?;
        assert_eq!(exists, 0, "the release created the stock key again");
        Ok(())
    });
}
