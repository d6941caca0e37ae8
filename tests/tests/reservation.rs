//! The Redis reservation scripts (docs/architecture.md §4) against the real Redis: each
//! test under its own key prefix, every assertion on state read back.

use anyhow::{Result, bail, ensure};
use redis::AsyncCommands;
use seckill_engine::{
    ActivityId, MessageId, MqStatus, OrderId, ReleaseOutcome, RequestId, Reservation,
    ReservationError, ReservationId, ReservationStore, ReserveOutcome, ReserveRequest, SeedOutcome,
    SkuId, UserId,
};
use seckill_tests::{Setup, TestEnv, run};
use std::collections::HashSet;

const NOW: i64 = 1_700_000_000_000;
const VALID_MS: i64 = 300_000;
const DAY_MS: i64 = 86_400_000;
const A: ActivityId = ActivityId(7);
const B: ActivityId = ActivityId(8);
const SKU: SkuId = SkuId(42);

fn store(env: &TestEnv) -> ReservationStore {
    ReservationStore::new(env.redis.clone(), env.cfg.redis_prefix.clone())
}

/// A store on its own connection, so racing tasks really interleave at Redis.
async fn own_store(env: &TestEnv) -> Result<ReservationStore> {
    let conn = seckill_engine::redis_conn::connect(&env.cfg).await?;
    Ok(ReservationStore::new(conn, env.cfg.redis_prefix.clone()))
}

fn request(activity: ActivityId, sku: SkuId, user: i64) -> ReserveRequest {
    let reservation_id = ReservationId::generate();
    ReserveRequest {
        activity_id: activity,
        sku_id: sku,
        user_id: UserId(user),
        request_id: RequestId::generate(),
        trace_id: seckill_engine::TraceId::of_reservation(&reservation_id),
        reservation_id,
        message_id: MessageId::generate(),
        order_id: OrderId::generate(),
        now_ms: NOW,
        valid_until_ms: NOW + VALID_MS,
    }
}

async fn reserve(
    store: &ReservationStore,
    activity: ActivityId,
    user: i64,
    first_retry_at: i64,
) -> Result<Reservation> {
    match store
        .reserve(&request(activity, SKU, user), first_retry_at)
        .await?
    {
        ReserveOutcome::Reserved(r) => Ok(r),
        other => bail!("user {user}: expected Reserved, got {other:?}"),
    }
}

async fn get(store: &ReservationStore, r: &Reservation) -> Result<Reservation> {
    match store.get(r.activity_id, &r.reservation_id).await? {
        Some(r) => Ok(r),
        None => bail!("{} vanished", r.reservation_id),
    }
}

async fn score(env: &TestEnv, r: &Reservation) -> Result<Option<i64>> {
    let pending = store(env).keys(r.activity_id).pending();
    Ok(env
        .redis
        .clone()
        .zscore(pending, r.reservation_id.as_str())
        .await?)
}

async fn is_buyer(env: &TestEnv, activity: ActivityId, user: UserId) -> Result<bool> {
    let buyers = store(env).keys(activity).buyers();
    Ok(env.redis.clone().sismember(buyers, user.0).await?)
}

#[test]
fn reserve_writes_everything_once_per_request() {
    run(Setup::EmptyDatabase, |env| async move {
        let s = store(&env);
        s.seed_stock(A, SKU, 10, false, 1).await?;
        let req = request(A, SKU, 1);
        let ReserveOutcome::Reserved(r) = s.reserve(&req, NOW + 3_000).await? else {
            bail!("expected Reserved");
        };
        // What Redis holds is what reserve returned.
        assert_eq!(get(&s, &r).await?, r);
        assert_eq!(r.message_id, req.message_id);
        assert_eq!(r.mq_status, MqStatus::MqPending);
        assert_eq!((r.send_attempt, r.lease_owner.as_deref()), (0, None));
        assert_eq!((r.created_at_ms, r.valid_until_ms), (NOW, NOW + VALID_MS));
        assert_eq!(s.stock(A, SKU).await?, Some(9));
        assert!(is_buyer(&env, A, UserId(1)).await?);
        assert_eq!(score(&env, &r).await?, Some(NOW + 3_000));

        // Physical TTL: past validity, the longest pay window and a day, on
        // both the hash and the request key.
        let keys = s.keys(A);
        let mut redis = env.redis.clone();
        let mapped: Option<String> = redis.get(keys.req(&req.request_id)).await?;
        assert_eq!(mapped.as_deref(), Some(r.reservation_id.as_str()));
        for key in [keys.rsv(&r.reservation_id), keys.req(&req.request_id)] {
            let ttl: i64 = redis.pttl(&key).await?;
            let want = VALID_MS + seckill_engine::activity::MAX_WINDOW_MS + DAY_MS;
            ensure!(ttl > want - 60_000 && ttl <= want, "{key}: pttl {ttl}");
        }

        // A client retry: same request_id, fresh ids. Nothing changes.
        let retry = ReserveRequest {
            reservation_id: ReservationId::generate(),
            message_id: MessageId::generate(),
            order_id: OrderId::generate(),
            ..req.clone()
        };
        assert_eq!(
            s.reserve(&retry, NOW + 3_000).await?,
            ReserveOutcome::Existing(r.clone())
        );
        assert_eq!(s.stock(A, SKU).await?, Some(9));
        assert_eq!(s.live_reservations(A).await?, 1);
        assert_eq!(s.pending_count(A).await?, 1);
        assert_eq!(s.get(A, &retry.reservation_id).await?, None);

        // A reused reservation id never overwrites the live hash.
        let reused = ReserveRequest {
            request_id: RequestId::generate(),
            user_id: UserId(2),
            ..req.clone()
        };
        match s.reserve(&reused, NOW).await {
            Err(ReservationError::IdInUse(id)) => assert_eq!(id, r.reservation_id),
            other => bail!("expected IdInUse, got {other:?}"),
        }
        assert_eq!(get(&s, &r).await?, r);
        assert_eq!(s.stock(A, SKU).await?, Some(9));
        assert!(!is_buyer(&env, A, UserId(2)).await?);
        Ok(())
    });
}

#[test]
fn sold_out_duplicate_user_and_not_seeded() {
    run(Setup::EmptyDatabase, |env| async move {
        let s = store(&env);
        s.seed_stock(A, SKU, 3, false, 1).await?;
        s.seed_stock(A, SkuId(44), 5, false, 1).await?;
        reserve(&s, A, 1, NOW).await?;
        // One live reservation per user per activity, whatever the sku.
        for sku in [SKU, SkuId(44)] {
            assert_eq!(
                s.reserve(&request(A, sku, 1), NOW).await?,
                ReserveOutcome::DuplicateUser
            );
        }
        assert_eq!(s.stock(A, SkuId(44)).await?, Some(5));
        reserve(&s, A, 2, NOW).await?;
        reserve(&s, A, 3, NOW).await?;
        assert_eq!(
            s.reserve(&request(A, SKU, 4), NOW).await?,
            ReserveOutcome::SoldOut
        );
        assert_eq!(s.stock(A, SKU).await?, Some(0));
        assert!(!is_buyer(&env, A, UserId(4)).await?);

        assert_eq!(
            s.reserve(&request(A, SkuId(43), 5), NOW).await?,
            ReserveOutcome::NotSeeded
        );
        assert_eq!(s.stock(A, SkuId(43)).await?, None);
        assert!(!is_buyer(&env, A, UserId(5)).await?);
        assert_eq!(s.live_reservations(A).await?, 3);
        assert_eq!(s.pending_count(A).await?, 3);
        Ok(())
    });
}

#[test]
fn concurrent_reserves_never_oversell() {
    run(Setup::EmptyDatabase, |env| async move {
        const TASKS: i64 = 16;
        const USERS: i64 = 300;
        store(&env).seed_stock(A, SKU, 100, false, 1).await?;
        let mut tasks = tokio::task::JoinSet::new();
        for t in 0..TASKS {
            let s = own_store(&env).await?;
            tasks.spawn(async move {
                let mut won = Vec::new();
                let mut sold_out = 0;
                for user in (1..=USERS).filter(|u| u % TASKS == t) {
                    match s.reserve(&request(A, SKU, user), NOW).await? {
                        ReserveOutcome::Reserved(r) => won.push(r.user_id.0),
                        ReserveOutcome::SoldOut => sold_out += 1,
                        other => bail!("user {user}: {other:?}"),
                    }
                }
                Ok((won, sold_out))
            });
        }
        let (mut won, mut sold_out) = (HashSet::new(), 0);
        while let Some(r) = tasks.join_next().await {
            let (w, s) = r??;
            won.extend(w);
            sold_out += s;
        }
        assert_eq!((won.len(), sold_out), (100, 200));
        let s = store(&env);
        assert_eq!(s.stock(A, SKU).await?, Some(0));
        assert_eq!(s.pending_count(A).await?, 100);
        let buyers: HashSet<i64> = env.redis.clone().smembers(s.keys(A).buyers()).await?;
        assert_eq!(buyers, won);
        Ok(())
    });
}

#[test]
fn mark_sent_is_a_cas_on_message_id() {
    run(Setup::EmptyDatabase, |env| async move {
        let s = store(&env);
        s.seed_stock(A, SKU, 10, false, 1).await?;
        s.seed_stock(B, SKU, 10, false, 1).await?;
        let r1 = reserve(&s, A, 1, NOW).await?;

        assert!(
            !s.mark_sent(A, &r1.reservation_id, &MessageId::generate(), "b-0")
                .await?
        );
        assert_eq!(get(&s, &r1).await?, r1);
        assert_eq!(score(&env, &r1).await?, Some(NOW));

        assert!(
            s.mark_sent(A, &r1.reservation_id, &r1.message_id, "b-1")
                .await?
        );
        let sent = get(&s, &r1).await?;
        assert_eq!(sent.mq_status, MqStatus::MqSent);
        assert_eq!(sent.broker_message_id.as_deref(), Some("b-1"));
        assert_eq!(score(&env, &r1).await?, None);
        // A late duplicate confirmation writes nothing.
        assert!(
            !s.mark_sent(A, &r1.reservation_id, &r1.message_id, "b-2")
                .await?
        );
        assert_eq!(get(&s, &r1).await?, sent);

        // One batch across two activities, with a stale and a wrong item.
        let r2 = reserve(&s, A, 2, NOW).await?;
        let r3 = reserve(&s, B, 3, NOW).await?;
        let r4 = reserve(&s, B, 4, NOW).await?;
        let applied = s
            .mark_sent_many(
                &[
                    (A, r2.reservation_id.clone(), r2.message_id.clone()),
                    (B, r3.reservation_id.clone(), r3.message_id.clone()),
                    (A, r1.reservation_id.clone(), r1.message_id.clone()),
                    (B, r4.reservation_id.clone(), MessageId::generate()),
                ],
                "batch-1",
            )
            .await?;
        assert_eq!(applied, [true, true, false, false]);
        for (r, status, broker) in [
            (&r2, MqStatus::MqSent, Some("batch-1")),
            (&r3, MqStatus::MqSent, Some("batch-1")),
            (&r1, MqStatus::MqSent, Some("b-1")),
            (&r4, MqStatus::MqPending, None),
        ] {
            let now = get(&s, r).await?;
            assert_eq!(
                (now.mq_status, now.broker_message_id.as_deref()),
                (status, broker)
            );
        }
        assert_eq!(
            (s.pending_count(A).await?, s.pending_count(B).await?),
            (0, 1)
        );
        assert_eq!(s.mark_sent_many(&[], "x").await?, Vec::<bool>::new());

        // After SCRIPT FLUSH (a Redis restart) the batch still runs in one go.
        let () = redis::cmd("SCRIPT")
            .arg("FLUSH")
            .query_async(&mut env.redis.clone())
            .await?;
        let applied = s
            .mark_sent_many(
                &[(B, r4.reservation_id.clone(), r4.message_id.clone())],
                "b-4",
            )
            .await?;
        assert_eq!(applied, [true]);
        assert_eq!(get(&s, &r4).await?.mq_status, MqStatus::MqSent);
        Ok(())
    });
}

#[test]
fn claim_due_leases_only_due_work() {
    run(Setup::EmptyDatabase, |env| async move {
        let s = store(&env);
        s.seed_stock(A, SKU, 10, false, 1).await?;
        let r1 = reserve(&s, A, 1, NOW + 1_000).await?;
        let r2 = reserve(&s, A, 2, NOW + 2_000).await?;
        let r3 = reserve(&s, A, 3, NOW + 10_000).await?;
        let ids = |v: &[Reservation]| {
            v.iter()
                .map(|r| r.reservation_id.clone())
                .collect::<Vec<_>>()
        };

        assert!(s.claim_due(A, NOW + 999, 10, "a", 5_000).await?.is_empty());
        let claimed = s.claim_due(A, NOW + 2_000, 10, "a", 5_000).await?;
        assert_eq!(
            ids(&claimed),
            [r1.reservation_id.clone(), r2.reservation_id.clone()]
        );
        for c in &claimed {
            assert_eq!(get(&s, c).await?, *c);
            assert_eq!(c.mq_status, MqStatus::Sending);
            assert_eq!(c.lease_owner.as_deref(), Some("a"));
            assert_eq!((c.lease_until_ms, c.send_attempt), (NOW + 7_000, 1));
            assert_eq!(score(&env, c).await?, Some(NOW + 7_000));
        }

        // Leased: nobody else gets them until the lease runs out, even when
        // the score says due: the lease decides.
        let mut redis = env.redis.clone();
        let pending = s.keys(A).pending();
        assert!(
            s.claim_due(A, NOW + 2_000, 10, "b", 5_000)
                .await?
                .is_empty()
        );
        let _: i64 = redis
            .zadd(&pending, r1.reservation_id.as_str(), NOW)
            .await?;
        assert!(
            s.claim_due(A, NOW + 2_000, 10, "b", 5_000)
                .await?
                .is_empty()
        );
        assert!(
            s.claim_due(A, NOW + 6_999, 10, "b", 5_000)
                .await?
                .is_empty()
        );
        // Owner "a" died; at lease end "b" takes over, as the next attempt.
        let taken = s.claim_due(A, NOW + 7_000, 10, "b", 5_000).await?;
        assert_eq!(ids(&taken), ids(&claimed));
        for t in &taken {
            assert_eq!((t.lease_owner.as_deref(), t.send_attempt), (Some("b"), 2));
        }

        // The limit bounds the batch; the lowest score goes first.
        let one = s.claim_due(A, NOW + 60_000, 1, "c", 5_000).await?;
        assert_eq!(ids(&one), std::slice::from_ref(&r3.reservation_id));
        assert!(
            s.claim_due(A, NOW + 60_000, 0, "c", 5_000)
                .await?
                .is_empty()
        );

        // Final or vanished members are dropped, not claimed.
        assert!(
            s.mark_sent(A, &r1.reservation_id, &r1.message_id, "m")
                .await?
        );
        let ghost = ReservationId::generate();
        let _: i64 = redis
            .zadd(&pending, r1.reservation_id.as_str(), NOW)
            .await?;
        let _: i64 = redis.zadd(&pending, ghost.as_str(), NOW).await?;
        let got = s.claim_due(A, NOW + 70_000, 10, "d", 5_000).await?;
        assert_eq!(
            ids(&got),
            [r2.reservation_id.clone(), r3.reservation_id.clone()]
        );
        assert_eq!(score(&env, &r1).await?, None);
        let ghost_score: Option<i64> = redis.zscore(&pending, ghost.as_str()).await?;
        assert_eq!(ghost_score, None);
        assert_eq!(get(&s, &r1).await?.mq_status, MqStatus::MqSent);
        Ok(())
    });
}

#[test]
fn racing_claimers_never_share_a_reservation() {
    run(Setup::EmptyDatabase, |env| async move {
        let s = store(&env);
        s.seed_stock(A, SKU, 60, false, 1).await?;
        let mut all = HashSet::new();
        for user in 1..=60 {
            all.insert(reserve(&s, A, user, NOW).await?.reservation_id);
        }
        let mut tasks = tokio::task::JoinSet::new();
        for owner in ["a", "b", "c"] {
            let s = own_store(&env).await?;
            tasks.spawn(async move {
                let mut mine = Vec::new();
                loop {
                    let batch = s.claim_due(A, NOW + 10, 7, owner, 60_000).await?;
                    if batch.is_empty() {
                        return anyhow::Ok((owner, mine));
                    }
                    mine.extend(batch.into_iter().map(|r| r.reservation_id));
                }
            });
        }
        let mut seen = HashSet::new();
        while let Some(r) = tasks.join_next().await {
            let (owner, mine) = r??;
            for id in mine {
                let held = s.get(A, &id).await?.map(|r| r.lease_owner);
                assert_eq!(held, Some(Some(owner.to_owned())), "{id}");
                assert!(seen.insert(id.clone()), "{id} claimed twice");
            }
        }
        assert_eq!(seen, all);
        Ok(())
    });
}

#[test]
fn reschedule_needs_the_lease_holder_and_message_id() {
    run(Setup::EmptyDatabase, |env| async move {
        let s = store(&env);
        s.seed_stock(A, SKU, 10, false, 1).await?;
        let r = reserve(&s, A, 1, NOW).await?;
        // Not leased yet: nothing to hand back.
        assert!(
            !s.reschedule(A, &r.reservation_id, &r.message_id, "a", NOW + 9, "x")
                .await?
        );
        let [leased] = &s.claim_due(A, NOW, 10, "a", 5_000).await?[..] else {
            bail!("expected one claim");
        };
        let rid = &r.reservation_id;
        assert!(
            !s.reschedule(A, rid, &r.message_id, "b", NOW + 9, "x")
                .await?
        );
        assert!(
            !s.reschedule(A, rid, &MessageId::generate(), "a", NOW + 9, "x")
                .await?
        );
        assert_eq!(get(&s, &r).await?, *leased);
        assert_eq!(score(&env, &r).await?, Some(NOW + 5_000));

        assert!(
            s.reschedule(A, rid, &r.message_id, "a", NOW + 1_500, "timeout")
                .await?
        );
        let back = get(&s, &r).await?;
        assert_eq!(back.mq_status, MqStatus::MqPending);
        assert_eq!(
            (back.next_retry_at_ms, back.last_error.as_deref()),
            (NOW + 1_500, Some("timeout"))
        );
        assert_eq!((back.lease_owner, back.lease_until_ms), (None, 0));
        assert_eq!(score(&env, &r).await?, Some(NOW + 1_500));
        assert!(
            !s.reschedule(A, rid, &r.message_id, "a", NOW + 9, "again")
                .await?
        );

        // Due again at the new time, for anyone, as the next attempt.
        assert!(
            s.claim_due(A, NOW + 1_499, 10, "b", 5_000)
                .await?
                .is_empty()
        );
        let again = s.claim_due(A, NOW + 1_500, 10, "b", 5_000).await?;
        assert_eq!(
            again.iter().map(|r| r.send_attempt).collect::<Vec<_>>(),
            [2]
        );
        Ok(())
    });
}

#[test]
fn send_failure_then_release_gives_stock_back_once() {
    run(Setup::EmptyDatabase, |env| async move {
        let s = store(&env);
        s.seed_stock(A, SKU, 5, false, 1).await?;
        let req = request(A, SKU, 1);
        let ReserveOutcome::Reserved(r) = s.reserve(&req, NOW).await? else {
            bail!("expected Reserved");
        };
        let other = reserve(&s, A, 2, NOW).await?;
        let rid = &r.reservation_id;

        assert!(
            !s.mark_send_failed(A, rid, &MessageId::generate(), "no topic")
                .await?
        );
        assert_eq!(get(&s, &r).await?, r);
        assert!(
            s.mark_send_failed(A, rid, &r.message_id, "no topic")
                .await?
        );
        let failed = get(&s, &r).await?;
        assert_eq!(
            (failed.mq_status, failed.last_error.as_deref()),
            (MqStatus::SendFailed, Some("no topic"))
        );
        assert_eq!(score(&env, &r).await?, None);
        // Neither a late confirmation nor the scanner revives it.
        assert!(!s.mark_sent(A, rid, &r.message_id, "late").await?);
        assert!(!s.mark_send_failed(A, rid, &r.message_id, "again").await?);
        assert_eq!(get(&s, &r).await?, failed);
        let claimed = s.claim_due(A, NOW + 60_000, 10, "a", 5_000).await?;
        assert_eq!(claimed.len(), 1);
        assert_eq!(claimed[0].reservation_id, other.reservation_id);
        assert_eq!(s.stock(A, SKU).await?, Some(3));

        assert_eq!(s.release(A, rid).await?, ReleaseOutcome::Released);
        assert_eq!(s.stock(A, SKU).await?, Some(4));
        assert!(!is_buyer(&env, A, UserId(1)).await?);
        assert_eq!(get(&s, &r).await?.mq_status, MqStatus::Released);
        assert_eq!(s.release(A, rid).await?, ReleaseOutcome::AlreadyReleased);
        assert_eq!(s.stock(A, SKU).await?, Some(4));
        assert_eq!(s.live_reservations(A).await?, 1);

        // The request still answers with its (released) reservation, and the
        // freed user may reserve anew; the old release stays a no-op.
        let ReserveOutcome::Existing(e) = s.reserve(&req, NOW).await? else {
            bail!("expected Existing");
        };
        assert_eq!(
            (e.reservation_id.clone(), e.mq_status),
            (rid.clone(), MqStatus::Released)
        );
        reserve(&s, A, 1, NOW).await?;
        assert_eq!(s.release(A, rid).await?, ReleaseOutcome::AlreadyReleased);
        assert!(is_buyer(&env, A, UserId(1)).await?);
        assert_eq!(s.stock(A, SKU).await?, Some(3));

        let unknown = ReservationId::generate();
        assert_eq!(s.release(A, &unknown).await?, ReleaseOutcome::Unknown);
        assert_eq!(s.get(A, &unknown).await?, None);
        assert_eq!(s.stock(A, SKU).await?, Some(3));
        Ok(())
    });
}

#[test]
fn concurrent_releases_give_stock_back_exactly_once() {
    run(Setup::EmptyDatabase, |env| async move {
        let s = store(&env);
        s.seed_stock(A, SKU, 5, false, 1).await?;
        let r = reserve(&s, A, 1, NOW).await?;
        let mut stores = Vec::new();
        for _ in 0..8 {
            stores.push(own_store(&env).await?);
        }
        let mut tasks = tokio::task::JoinSet::new();
        for i in 0..50 {
            let s = stores[i % stores.len()].clone();
            let id = r.reservation_id.clone();
            tasks.spawn(async move { s.release(A, &id).await });
        }
        let mut outcomes = Vec::new();
        while let Some(o) = tasks.join_next().await {
            outcomes.push(o??);
        }
        let released = outcomes
            .iter()
            .filter(|o| **o == ReleaseOutcome::Released)
            .count();
        let already = outcomes
            .iter()
            .filter(|o| **o == ReleaseOutcome::AlreadyReleased)
            .count();
        assert_eq!((released, already), (1, 49));
        assert_eq!(s.stock(A, SKU).await?, Some(5));
        assert!(!is_buyer(&env, A, UserId(1)).await?);
        assert_eq!(s.live_reservations(A).await?, 0);
        assert_eq!(s.pending_count(A).await?, 0);
        Ok(())
    });
}

#[test]
fn seed_stock_refuses_to_overwrite_without_force() {
    run(Setup::EmptyDatabase, |env| async move {
        let s = store(&env);
        assert_eq!(s.stock(A, SKU).await?, None);
        assert_eq!(s.activities().await?, []);
        assert_eq!(
            s.seed_stock(A, SKU, 10, false, 1).await?,
            SeedOutcome::Seeded
        );
        reserve(&s, A, 1, NOW).await?;
        assert_eq!(
            s.seed_stock(A, SKU, 20, false, 1).await?,
            SeedOutcome::AlreadySeeded { current: 9 }
        );
        assert_eq!(s.stock(A, SKU).await?, Some(9));
        assert_eq!(
            s.seed_stock(A, SKU, 20, true, 1).await?,
            SeedOutcome::Seeded
        );
        assert_eq!(s.stock(A, SKU).await?, Some(20));
        assert_eq!(
            s.seed_stock(B, SKU, 1, false, 1).await?,
            SeedOutcome::Seeded
        );
        assert_eq!(s.activities().await?, [A, B]);
        Ok(())
    });
}

#[test]
fn pending_views_follow_the_zset() {
    run(Setup::EmptyDatabase, |env| async move {
        let s = store(&env);
        s.seed_stock(A, SKU, 10, false, 1).await?;
        assert_eq!(s.oldest_pending(A).await?, None);
        let late = reserve(&s, A, 1, NOW + 5_000).await?;
        let early = reserve(&s, A, 2, NOW + 1_000).await?;
        assert_eq!(s.pending_count(A).await?, 2);
        assert_eq!(s.oldest_pending(A).await?, Some(early.clone()));
        assert!(
            s.mark_sent(A, &early.reservation_id, &early.message_id, "m")
                .await?
        );
        assert_eq!(s.pending_count(A).await?, 1);
        assert_eq!(s.oldest_pending(A).await?, Some(late.clone()));
        // Sent still holds stock: only release frees it (docs/architecture.md §12).
        assert_eq!(s.live_reservations(A).await?, 2);
        assert_eq!(
            s.release(A, &late.reservation_id).await?,
            ReleaseOutcome::Released
        );
        assert_eq!(s.oldest_pending(A).await?, None);
        assert_eq!(s.live_reservations(A).await?, 1);
        assert_eq!(s.stock(A, SKU).await?, Some(9));
        Ok(())
    });
}
