//! [`ReservationStore`]: the Redis side of docs/architecture.md §4, one method per step.

use super::{
    Keys, MqStatus, OrderView, PendingEntry, ReleaseOutcome, Reservation, ReservationError,
    ReserveOutcome, ReserveRequest, RetireOutcome, Sale, SeedOutcome, activities_key, corrupt,
    physical_ttl_ms,
};
use crate::decide::replica_ack::{AckState, Outcome, Plan};
use crate::domain::clock::now_ms;
use crate::domain::ids::{ActivityId, MessageId, OrderId, ReservationId, SkuId};
use crate::domain::status::OrderStatus;
use crate::store::redis::RedisConn;
use redis::{AsyncCommands, Script};
use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, LazyLock, Mutex};

type Result<T, E = ReservationError> = std::result::Result<T, E>;

const MARK_SENT_LUA: &str = include_str!("mark_sent.lua");

// `Script` invokes by EVALSHA and loads the source on NOSCRIPT.
static RESERVE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("reserve.lua")));
static MARK_SENT: LazyLock<Script> = LazyLock::new(|| Script::new(MARK_SENT_LUA));
static CLAIM_DUE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("claim_due.lua")));
static RESCHEDULE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("reschedule.lua")));
static MARK_SEND_FAILED: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("mark_send_failed.lua")));
static RELEASE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("release.lua")));
static PROJECT: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("project.lua")));
static RETIRE: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("retire.lua")));

/// A read, tried once more on a fresh connection when the first failed
/// because the connection broke: a Redis that restarted or failed over
/// fails the first command on the old connection ("broken pipe") and the
/// manager reconnects behind it. Reads only: a write whose reply was lost
/// may have been applied, and its caller decides (docs/architecture.md §4.5).
macro_rules! read_twice {
    ($self:ident, $conn:ident => $body:expr) => {{
        let mut $conn = $self.conn();
        match $body {
            Err(e) if connection_broke(&e) => {
                tracing::warn!(error = %e, "the Redis connection broke; reading again on a new one");
                let mut $conn = $self.conn();
                $body
            }
            r => r,
        }
    }};
}
pub(super) use read_twice;

pub(super) fn connection_broke(e: &redis::RedisError) -> bool {
    e.is_connection_dropped() || e.is_io_error()
}

/// The positions of each activity in `activities`, activities in the
/// order they first appear (pure): the slot groups of a pipeline.
pub(super) fn by_activity(
    activities: impl IntoIterator<Item = ActivityId>,
) -> Vec<(ActivityId, Vec<usize>)> {
    let mut groups: Vec<(ActivityId, Vec<usize>)> = Vec::new();
    for (i, a) in activities.into_iter().enumerate() {
        match groups.iter_mut().find(|(g, _)| *g == a) {
            Some((_, idx)) => idx.push(i),
            None => groups.push((a, vec![i])),
        }
    }
    groups
}

/// How long a projected order view lives: long past any pay window; it
/// only bounds memory.
const VIEW_TTL_MS: i64 = 7 * 24 * 60 * 60 * 1000;

/// Reservations of every activity under one key prefix. Cheap to clone: a
/// multiplexed connection and a shared prefix.
#[derive(Clone)]
pub struct ReservationStore {
    conn: RedisConn,
    prefix: Arc<str>,
    wait: Option<ReplicaWait>,
    /// Per activity (one slot, so one shard): whether its writes wait.
    acks: Arc<Mutex<HashMap<ActivityId, AckState>>>,
    /// Connections of their own for the writes that wait: `WAIT` blocks the
    /// connection it is sent on, and every command queued behind it, so
    /// waits are spread over these, round robin, away from everything
    /// else (docs/architecture.md §4.6). Empty: the one connection.
    wait_lanes: Arc<[RedisConn]>,
    next_lane: Arc<AtomicUsize>,
    unreplicated: Arc<AtomicU64>,
}

/// How many replicas must hold a reservation before it is answered, and
/// how long to wait for them (`[redis] wait_replicas`, docs/architecture.md §4.6).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplicaWait {
    pub replicas: u32,
    pub timeout_ms: u64,
}

impl std::fmt::Debug for ReservationStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReservationStore")
            .field("prefix", &self.prefix)
            .finish_non_exhaustive()
    }
}

impl ReservationStore {
    pub fn new(conn: RedisConn, prefix: impl Into<String>) -> Self {
        Self {
            conn,
            prefix: prefix.into().into(),
            wait: None,
            acks: Arc::default(),
            wait_lanes: Arc::from(Vec::new()),
            next_lane: Arc::default(),
            unreplicated: Arc::default(),
        }
    }

    /// Reservations wait for `wait.replicas` replicas (none when 0).
    pub fn with_replica_wait(mut self, wait: ReplicaWait) -> Self {
        self.wait = (wait.replicas > 0).then_some(wait);
        self
    }

    /// The connections the waiting writes take turns on.
    pub fn with_wait_lanes(mut self, lanes: Vec<RedisConn>) -> Self {
        self.wait_lanes = Arc::from(lanes);
        self
    }

    fn wait_lane(&self) -> RedisConn {
        if self.wait_lanes.is_empty() {
            return self.conn();
        }
        let i = self.next_lane.fetch_add(1, Ordering::Relaxed) % self.wait_lanes.len();
        self.wait_lanes[i].clone()
    }

    pub fn keys(&self, activity: ActivityId) -> Keys {
        Keys::new(&self.prefix, activity)
    }

    pub(super) fn conn(&self) -> RedisConn {
        self.conn.clone()
    }

    pub(super) fn activities_key(&self) -> String {
        activities_key(&self.prefix)
    }

    /// Sets an activity's Redis stock and its `epoch` (docs/architecture.md
    /// §4.5), and registers the activity for the scanner. Without `force` an
    /// existing stock is left alone: re-seeding a running sale would break
    /// conservation (docs/architecture.md §12). `SET NX GET` needs Redis 7.
    pub async fn seed_stock(
        &self,
        activity: ActivityId,
        sku: SkuId,
        stock: i64,
        force: bool,
        epoch: i64,
    ) -> Result<SeedOutcome> {
        let key = self.keys(activity).stock(sku);
        let mut conn = self.conn();
        let outcome = if force {
            let () = conn.set(&key, stock).await?;
            SeedOutcome::Seeded
        } else {
            let current: Option<i64> = redis::cmd("SET")
                .arg(&key)
                .arg(stock)
                .arg("NX")
                .arg("GET")
                .query_async(&mut conn)
                .await?;
            current.map_or(SeedOutcome::Seeded, |current| SeedOutcome::AlreadySeeded {
                current,
            })
        };
        // The epoch after the stock: a reservation checks the epoch first, so
        // the activity opens only once its stock is in place.
        let () = conn.set(self.keys(activity).epoch(), epoch).await?;
        // Registered here, off the reserve hot path: an activity is reservable
        // only once seeded.
        let _: i64 = conn.sadd(activities_key(&self.prefix), activity.0).await?;
        Ok(outcome)
    }

    pub async fn stock(&self, activity: ActivityId, sku: SkuId) -> Result<Option<i64>> {
        let key = self.keys(activity).stock(sku);
        Ok(read_twice!(self, c => c.get(&key).await)?)
    }

    /// The reserve script (docs/architecture.md §4). `first_retry_at_ms` is when the
    /// scanner first looks at it, should the in-process send never confirm
    /// (the process died right after reserving: docs/architecture.md §1, window 1).
    pub async fn reserve(
        &self,
        req: &ReserveRequest,
        first_retry_at_ms: i64,
    ) -> Result<ReserveOutcome> {
        self.reserve_in(req, first_retry_at_ms, Sale::Open).await
    }

    /// [`Self::reserve`] as the ingress calls it, saying whether the sale
    /// has ended: then only a request seen before gets its reservation back
    /// (docs/architecture.md §16.3), checked in the same script so a retry
    /// and a new request cannot be told apart by timing.
    pub async fn reserve_in(
        &self,
        req: &ReserveRequest,
        first_retry_at_ms: i64,
        sale: Sale,
    ) -> Result<ReserveOutcome> {
        let keys = self.keys(req.activity_id);
        let key_list = [
            keys.req(&req.request_id),
            keys.stock(req.sku_id),
            keys.buyers(),
            keys.rsv(&req.reservation_id),
            keys.pending(),
            keys.epoch(),
        ];
        let args = [
            req.reservation_id.to_string(),
            req.message_id.to_string(),
            req.request_id.to_string(),
            req.order_id.to_string(),
            req.sku_id.0.to_string(),
            req.user_id.0.to_string(),
            req.now_ms.to_string(),
            req.valid_until_ms.to_string(),
            first_retry_at_ms.to_string(),
            physical_ttl_ms(req.now_ms, req.valid_until_ms).to_string(),
            req.trace_id.to_string(),
            match sale {
                Sale::Open => "0",
                Sale::Ended => "1",
            }
            .to_owned(),
        ];
        let reply: Vec<String> = self
            .eval_acknowledged(
                &RESERVE,
                req.activity_id,
                &key_list,
                &args,
                |r: &Vec<String>| r.first().is_some_and(|r| r == "RESERVED"),
            )
            .await?;
        let req_key = || keys.req(&req.request_id);
        match reply.iter().map(String::as_str).collect::<Vec<_>>()[..] {
            ["RESERVED"] => Ok(ReserveOutcome::Reserved(Reservation {
                reservation_id: req.reservation_id.clone(),
                message_id: req.message_id.clone(),
                request_id: req.request_id.clone(),
                order_id: req.order_id.clone(),
                activity_id: req.activity_id,
                sku_id: req.sku_id,
                user_id: req.user_id,
                mq_status: MqStatus::MqPending,
                send_attempt: 0,
                next_retry_at_ms: first_retry_at_ms,
                lease_owner: None,
                lease_until_ms: 0,
                created_at_ms: req.now_ms,
                valid_until_ms: req.valid_until_ms,
                broker_message_id: None,
                last_error: None,
                trace_id: req.trace_id.clone(),
            })),
            // Read in a second call: the hash's key is only known from the
            // request key's value, and a script should touch declared keys.
            ["EXISTING", id] => {
                let id: ReservationId = id
                    .parse()
                    .map_err(|e| corrupt(&req_key(), format!("{e}")))?;
                match self.get(req.activity_id, &id).await? {
                    Some(r) => Ok(ReserveOutcome::Existing(r)),
                    None => Err(corrupt(&req_key(), format!("points at missing {id}"))),
                }
            }
            ["NOT_SEEDED"] => Ok(ReserveOutcome::NotSeeded),
            ["NO_EPOCH"] => Ok(ReserveOutcome::NoEpoch),
            ["ENDED"] => Ok(ReserveOutcome::Ended),
            ["SOLD_OUT"] => Ok(ReserveOutcome::SoldOut),
            ["DUPLICATE_USER"] => Ok(ReserveOutcome::DuplicateUser),
            ["ID_IN_USE"] => Err(ReservationError::IdInUse(req.reservation_id.clone())),
            _ => Err(corrupt(&req_key(), format!("reserve replied {reply:?}"))),
        }
    }

    /// Runs `script` and, with `[redis] wait_replicas`, `WAIT` after it in
    /// one pipeline, so both run on the master that owns the activity's
    /// slot, over one connection: a write that `wrote` says changed
    /// something is answered only once the replicas hold it, or the wait
    /// timed out (docs/architecture.md §4.6). A failover then promotes a
    /// replica that has every write already answered. An error (the master
    /// died before replying) leaves the write unknown to the caller, who
    /// asks again: every script here is idempotent. While the shard is short
    /// of replicas, writes go on unwaited ([`AckState`]).
    async fn eval_acknowledged<T: redis::FromRedisValue>(
        &self,
        script: &Script,
        activity: ActivityId,
        keys: &[String],
        args: &[String],
        wrote: impl Fn(&T) -> bool,
    ) -> Result<T> {
        let (wait, plan) = match self.wait.map(|wait| (wait, self.ack_plan(activity))) {
            Some((wait, plan @ (Plan::Wait | Plan::Probe))) => (wait, plan),
            unwaited => {
                let mut call = script.prepare_invoke();
                for k in keys {
                    call.key(k);
                }
                for a in args {
                    call.arg(a);
                }
                let reply: T = call.invoke_async(&mut self.conn()).await?;
                if let Some((wait, _)) = unwaited
                    && wrote(&reply)
                {
                    self.count_unreplicated(0, wait);
                }
                return Ok(reply);
            }
        };
        let mut conn = self.wait_lane();
        let mut pipe = redis::pipe();
        pipe.cmd("EVALSHA")
            .arg(script.get_hash())
            .arg(keys.len())
            .arg(keys)
            .arg(args)
            .cmd("WAIT")
            .arg(wait.replicas)
            .arg(wait.timeout_ms);
        // The cluster client follows MOVED, ASK and TRYAGAIN inside a
        // pipeline as for one command (a slot moving or failing over), and
        // sends it again: the scripts are idempotent, WAIT changes nothing.
        let replied: redis::RedisResult<(T, u32)> = match pipe.query_async(&mut conn).await {
            // Nothing ran: the script is not loaded on this master yet (it
            // restarted, or took over). Load it everywhere and go again.
            Err(e) if e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript) => {
                match script.prepare_invoke().load_async(&mut conn).await {
                    Ok(_) => pipe.query_async(&mut conn).await,
                    Err(e) => Err(e),
                }
            }
            r => r,
        };
        let outcome = match &replied {
            Ok((_, acked)) => Outcome::Acked(*acked),
            Err(_) => Outcome::Failed,
        };
        self.ack_settle(activity, plan, outcome, wait.replicas);
        let (reply, acked) = replied?;
        if wrote(&reply) {
            self.count_unreplicated(acked, wait);
        }
        Ok(reply)
    }

    fn ack_plan(&self, activity: ActivityId) -> Plan {
        let mut acks = self.acks.lock().unwrap_or_else(|e| e.into_inner());
        let state = acks.entry(activity).or_default();
        let (plan, next) = state.plan(now_ms());
        *state = next;
        plan
    }

    fn ack_settle(&self, activity: ActivityId, plan: Plan, outcome: Outcome, wanted: u32) {
        let mut acks = self.acks.lock().unwrap_or_else(|e| e.into_inner());
        let state = acks.entry(activity).or_default();
        let before = *state;
        *state = state.settle(plan, outcome, wanted, now_ms());
        if before != *state {
            tracing::warn!(%activity, from = ?before, to = ?*state, "the activity's Redis shard changed replica state (docs/architecture.md §4.6)");
        }
    }

    fn count_unreplicated(&self, acked: u32, wait: ReplicaWait) {
        if acked >= wait.replicas {
            return;
        }
        let n = self.unreplicated.fetch_add(1, Ordering::Relaxed) + 1;
        if n.is_power_of_two() {
            tracing::warn!(
                acked,
                wanted = wait.replicas,
                total = n,
                "a write was answered before a replica acknowledged it (is a replica down?); a failover now could lose it"
            );
        }
    }

    /// Whether writes to `activity`'s shard wait for its replicas now.
    pub fn replica_state(&self, activity: ActivityId) -> AckState {
        let acks = self.acks.lock().unwrap_or_else(|e| e.into_inner());
        acks.get(&activity).copied().unwrap_or_default()
    }

    /// Reservations and releases that went on with fewer replica
    /// acknowledgements than [`ReplicaWait::replicas`] since this store was made.
    pub fn unreplicated(&self) -> u64 {
        self.unreplicated.load(Ordering::Relaxed)
    }

    pub async fn get(
        &self,
        activity: ActivityId,
        reservation_id: &ReservationId,
    ) -> Result<Option<Reservation>> {
        let key = self.keys(activity).rsv(reservation_id);
        let hash: HashMap<String, String> = read_twice!(self, c => c.hgetall(&key).await)?;
        if hash.is_empty() {
            return Ok(None);
        }
        Reservation::from_hash(activity, reservation_id.clone(), &key, &hash).map(Some)
    }

    /// The broker confirmed the message: a CAS on `message_id` and a
    /// non-final status. `false` means nothing was written.
    pub async fn mark_sent(
        &self,
        activity: ActivityId,
        reservation_id: &ReservationId,
        message_id: &MessageId,
        broker_message_id: &str,
    ) -> Result<bool> {
        let keys = self.keys(activity);
        let applied: i64 = MARK_SENT
            .key(keys.rsv(reservation_id))
            .key(keys.pending())
            .arg(reservation_id.as_str())
            .arg(message_id.as_str())
            .arg(broker_message_id)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(applied == 1)
    }

    /// [`Self::mark_sent`] for a whole confirmed batch (docs/architecture.md §6), in one
    /// round trip per activity; the batch may mix activities. One result per item, in order.
    pub async fn mark_sent_many(
        &self,
        batch: &[(ActivityId, ReservationId, MessageId)],
        broker_message_id: &str,
    ) -> Result<Vec<bool>> {
        let mut applied = vec![false; batch.len()];
        // A pipeline must stay in one slot on Redis Cluster (the client
        // refuses a cross-slot one), and an activity's keys share its hash
        // tag: one pipeline per activity (docs/architecture.md §4.6).
        for (activity, items) in by_activity(batch.iter().map(|(a, _, _)| *a)) {
            let keys = self.keys(activity);
            let mut pipe = redis::pipe();
            // A pipeline does not reload on NOSCRIPT (Redis restarted, failed
            // over or flushed its scripts), and retrying half a batch would
            // report the applied half as refused. Loading first is cheap,
            // keeps one round trip, and on a cluster reaches the slot's master.
            pipe.cmd("SCRIPT").arg("LOAD").arg(MARK_SENT_LUA).ignore();
            for &i in &items {
                let (_, reservation_id, message_id) = &batch[i];
                pipe.cmd("EVALSHA")
                    .arg(MARK_SENT.get_hash())
                    .arg(2)
                    .arg(keys.rsv(reservation_id))
                    .arg(keys.pending())
                    .arg(reservation_id.as_str())
                    .arg(message_id.as_str())
                    .arg(broker_message_id);
            }
            let replies: Vec<i64> = pipe.query_async(&mut self.conn()).await?;
            for (i, n) in items.into_iter().zip(replies) {
                applied[i] = n == 1;
            }
        }
        Ok(applied)
    }

    /// Leases up to `limit` due reservations to `owner` until `now_ms + lease_ms`
    /// and returns them as leased (`SENDING`, `send_attempt` counted). Final or
    /// vanished members are dropped from the ZSET on the way.
    pub async fn claim_due(
        &self,
        activity: ActivityId,
        now_ms: i64,
        limit: usize,
        owner: &str,
        lease_ms: i64,
    ) -> Result<Vec<Reservation>> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let keys = self.keys(activity);
        let claimed: Vec<Vec<String>> = CLAIM_DUE
            .key(keys.pending())
            .arg(now_ms)
            .arg(limit)
            .arg(owner)
            .arg(now_ms.saturating_add(lease_ms))
            .arg(keys.rsv_prefix())
            .invoke_async(&mut self.conn())
            .await?;
        claimed
            .into_iter()
            .map(|entry| {
                let Some((id, fields)) = entry.split_first() else {
                    return Err(corrupt(
                        &keys.pending(),
                        "claim_due returned an empty entry",
                    ));
                };
                let id: ReservationId = id
                    .parse()
                    .map_err(|e| corrupt(&keys.pending(), format!("member: {e}")))?;
                let hash = fields
                    .chunks_exact(2)
                    .map(|kv| (kv[0].clone(), kv[1].clone()))
                    .collect();
                Reservation::from_hash(activity, id.clone(), &keys.rsv(&id), &hash)
            })
            .collect()
    }

    /// Hands a lease back after an UNKNOWN send: `MQ_PENDING` again, due at
    /// `next_retry_at_ms` (see [`super::backoff_ms`]). Only the lease holder
    /// may; `false` means nothing was written.
    pub async fn reschedule(
        &self,
        activity: ActivityId,
        reservation_id: &ReservationId,
        message_id: &MessageId,
        owner: &str,
        next_retry_at_ms: i64,
        last_error: &str,
    ) -> Result<bool> {
        let keys = self.keys(activity);
        let applied: i64 = RESCHEDULE
            .key(keys.rsv(reservation_id))
            .key(keys.pending())
            .arg(reservation_id.as_str())
            .arg(message_id.as_str())
            .arg(owner)
            .arg(next_retry_at_ms)
            .arg(last_error)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(applied == 1)
    }

    /// A DEFINITE send failure: `SEND_FAILED`, out of the scanner's ZSET.
    /// The stock stays taken until [`Self::release`].
    pub async fn mark_send_failed(
        &self,
        activity: ActivityId,
        reservation_id: &ReservationId,
        message_id: &MessageId,
        error: &str,
    ) -> Result<bool> {
        let keys = self.keys(activity);
        let applied: i64 = MARK_SEND_FAILED
            .key(keys.rsv(reservation_id))
            .key(keys.pending())
            .arg(reservation_id.as_str())
            .arg(message_id.as_str())
            .arg(error)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(applied == 1)
    }

    /// The compensation (docs/architecture.md §4, §8): gives the stock and the buyer slot
    /// back exactly once, however often or concurrently it is called.
    /// Takes an ended activity out of Redis (docs/architecture.md §16.3),
    /// unless a reservation still waits for its send: the epoch key goes
    /// (nothing more is admitted), the stock and buyers keys keep `ttl` for
    /// late releases and reads, and the activity leaves the set the scanner
    /// and the governor walk. Idempotent: a second call finds no epoch and
    /// nothing pending, and retires again to the same effect.
    pub async fn retire(
        &self,
        activity: ActivityId,
        skus: &[SkuId],
        ttl: std::time::Duration,
    ) -> Result<RetireOutcome> {
        let keys = self.keys(activity);
        let mut key_list = vec![keys.epoch(), keys.pending(), keys.buyers()];
        key_list.extend(skus.iter().map(|s| keys.stock(*s)));
        let ttl_ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1);
        let reply: (String, u64) = self
            .eval_acknowledged(
                &RETIRE,
                activity,
                &key_list,
                &[ttl_ms.to_string()],
                |r: &(String, u64)| r.0 == "RETIRED",
            )
            .await?;
        match reply {
            (r, n) if r == "PENDING" => Ok(RetireOutcome::Pending(n)),
            (r, _) if r == "RETIRED" => {
                // Outside the script: the set spans activities, so it sits in
                // no activity's slot (Redis Cluster). Run again by a retry.
                let mut conn = self.conn();
                let _: i64 = conn.srem(self.activities_key(), activity.0).await?;
                Ok(RetireOutcome::Retired)
            }
            (r, n) => Err(corrupt(&keys.epoch(), format!("retire replied {r:?} {n}"))),
        }
    }

    pub async fn release(
        &self,
        activity: ActivityId,
        reservation_id: &ReservationId,
    ) -> Result<ReleaseOutcome> {
        let keys = self.keys(activity);
        let rsv_key = keys.rsv(reservation_id);
        let mut conn = self.conn();
        // The stock key depends on the hash's sku, so read it first; sku_id
        // never changes, and the script checks it again.
        let sku: Option<String> = conn.hget(&rsv_key, "sku_id").await?;
        let Some(sku) = sku else {
            return Ok(ReleaseOutcome::Unknown);
        };
        let sku: SkuId = sku
            .parse()
            .map_err(|e| corrupt(&rsv_key, format!("field sku_id: {e}")))?;
        // A release lost in a failover would hold its unit for good: the
        // compensation that called it is acknowledged after it. So it waits
        // for the replicas as a reservation does; a second release is
        // ALREADY_RELEASED (docs/architecture.md §4.6).
        let reply: String = self
            .eval_acknowledged(
                &RELEASE,
                activity,
                &[
                    rsv_key.clone(),
                    keys.stock(sku),
                    keys.buyers(),
                    keys.pending(),
                ],
                &[reservation_id.to_string(), sku.0.to_string()],
                |r: &String| r == "RELEASED",
            )
            .await?;
        match reply.as_str() {
            "RELEASED" => Ok(ReleaseOutcome::Released),
            "ALREADY_RELEASED" => Ok(ReleaseOutcome::AlreadyReleased),
            "UNKNOWN" => Ok(ReleaseOutcome::Unknown),
            _ => Err(corrupt(&rsv_key, format!("release replied {reply:?}"))),
        }
    }

    /// Writes an order event into the query view, unless the view already
    /// holds this `aggregate_version` or a newer one (docs/architecture.md §8.7). True when
    /// it was written.
    pub async fn project_order(
        &self,
        activity: ActivityId,
        reservation_id: &ReservationId,
        order_id: &OrderId,
        status: OrderStatus,
        aggregate_version: i64,
        occurred_at_ms: i64,
    ) -> Result<bool> {
        let applied: i64 = PROJECT
            .key(self.keys(activity).view(reservation_id))
            .arg(aggregate_version)
            .arg(status.as_str())
            .arg(order_id.as_str())
            .arg(occurred_at_ms)
            .arg(VIEW_TTL_MS)
            .invoke_async(&mut self.conn())
            .await?;
        Ok(applied == 1)
    }

    /// The projected order status of a reservation, if any event arrived.
    pub async fn order_view(
        &self,
        activity: ActivityId,
        reservation_id: &ReservationId,
    ) -> Result<Option<OrderView>> {
        let key = self.keys(activity).view(reservation_id);
        let h: HashMap<String, String> = read_twice!(self, c => c.hgetall(&key).await)?;
        if h.is_empty() {
            return Ok(None);
        }
        let field = |name: &str| {
            h.get(name)
                .ok_or_else(|| corrupt(&key, format!("field {name} is missing")))
        };
        let bad =
            |name: &str, e: &dyn std::fmt::Display| corrupt(&key, format!("field {name}: {e}"));
        Ok(Some(OrderView {
            order_id: field("order_id")?
                .parse()
                .map_err(|e| bad("order_id", &e))?,
            status: field("status")?.parse().map_err(|e| bad("status", &e))?,
            aggregate_version: field("aggregate_version")?
                .parse()
                .map_err(|e| bad("aggregate_version", &e))?,
            occurred_at_ms: field("occurred_at")?
                .parse()
                .map_err(|e| bad("occurred_at", &e))?,
        }))
    }

    /// Reservations waiting for the scanner, leased ones included.
    pub async fn pending_count(&self, activity: ActivityId) -> Result<u64> {
        let key = self.keys(activity).pending();
        Ok(read_twice!(self, c => c.zcard(&key).await)?)
    }

    /// The pending reservation with the lowest score: the most overdue for a
    /// (re-)send. Its `created_at_ms` gives the age the backlog view shows.
    pub async fn oldest_pending(&self, activity: ActivityId) -> Result<Option<Reservation>> {
        let pending = self.keys(activity).pending();
        let first: Vec<String> = self.conn().zrange(&pending, 0, 0).await?;
        let Some(id) = first.first() else {
            return Ok(None);
        };
        let id: ReservationId = id
            .parse()
            .map_err(|e| corrupt(&pending, format!("member: {e}")))?;
        match self.get(activity, &id).await? {
            Some(r) => Ok(Some(r)),
            None => Err(corrupt(&pending, format!("member {id} has no hash"))),
        }
    }

    /// The send state of up to `cap` pending reservations, most overdue
    /// first, for `seckillctl pending` and the expiry alert. Read-only; one
    /// pipelined round trip for the hashes. A member whose hash is gone
    /// (the physical TTL lapsed) is skipped, not fatal: this is a view.
    pub async fn pending_entries(
        &self,
        activity: ActivityId,
        cap: usize,
    ) -> Result<Vec<PendingEntry>> {
        let keys = self.keys(activity);
        let pending = keys.pending();
        let stop = cap.saturating_sub(1) as isize;
        let members: Vec<(String, f64)> =
            read_twice!(self, c => c.zrange_withscores(&pending, 0, stop).await)?;
        if members.is_empty() || cap == 0 {
            return Ok(Vec::new());
        }
        let mut pipe = redis::pipe();
        for (id, _) in &members {
            pipe.cmd("HMGET")
                .arg(format!("{}{id}", keys.rsv_prefix()))
                .arg(&["created_at", "send_attempt", "valid_until"]);
        }
        let rows: Vec<(Option<i64>, Option<u32>, Option<i64>)> =
            pipe.query_async(&mut self.conn()).await?;
        Ok(members
            .into_iter()
            .zip(rows)
            .filter_map(|((_, due), row)| match row {
                (Some(created_at_ms), attempts, Some(valid_until_ms)) => Some(PendingEntry {
                    next_retry_at_ms: due as i64,
                    created_at_ms,
                    send_attempt: attempts.unwrap_or(0),
                    valid_until_ms,
                }),
                _ => None,
            })
            .collect())
    }

    /// Activities registered by [`Self::seed_stock`], in ascending order.
    pub async fn activities(&self) -> Result<Vec<ActivityId>> {
        let key = activities_key(&self.prefix);
        let members: Vec<String> = read_twice!(self, c => c.smembers(&key).await)?;
        let mut ids = members
            .iter()
            .map(|m| m.parse().map_err(|e| corrupt(&key, format!("{e}"))))
            .collect::<Result<Vec<ActivityId>>>()?;
        ids.sort_unstable();
        Ok(ids)
    }

    /// Reservations still holding a unit of stock: those not RELEASED, i.e.
    /// the buyers set. Redis conservation (docs/architecture.md §12) is
    /// `sum of stock + live_reservations = initial stock`, once quiet.
    pub async fn live_reservations(&self, activity: ActivityId) -> Result<u64> {
        let key = self.keys(activity).buyers();
        Ok(read_twice!(self, c => c.scard(&key).await)?)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pipeline_per_activity_keeps_every_position() {
        let groups = by_activity([ActivityId(2), ActivityId(1), ActivityId(2), ActivityId(3)]);
        assert_eq!(
            groups,
            vec![
                (ActivityId(2), vec![0, 2]),
                (ActivityId(1), vec![1]),
                (ActivityId(3), vec![3]),
            ]
        );
        assert!(by_activity([]).is_empty());
    }
}
