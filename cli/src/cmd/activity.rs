//! `seckillctl activity create|show|restore`.

use crate::output::{OutputFormat, Tabular, new_table, render};
use anyhow::{Context, Result, bail};
use seckill_engine::{
    ActivityId, ActivityView, Actor, ClientRuntime, Config, Names, NewActivity, ReservationStore,
    RestoreReport, RestoreRequest, RocketAdmin, SkuId, TopicKind, Via, activity, audit, db,
    redis_conn, redis_state, retry_topic,
};
use std::sync::Arc;
use std::time::{Duration, Instant};

#[derive(Debug, clap::Subcommand)]
pub enum ActivityCmd {
    /// Seed PostgreSQL inventory and Redis stock for one SKU, consistently
    Create {
        #[arg(long)]
        activity: ActivityId,
        #[arg(long)]
        sku: SkuId,
        #[arg(long)]
        stock: i64,
        /// How long a reservation may wait to become an order (business validity)
        #[arg(long, value_parser = crate::parse::duration, default_value = "5m")]
        valid_for: Duration,
        /// How long an order may stay unpaid before it is cancelled
        #[arg(long, value_parser = crate::parse::duration, default_value = "15m")]
        pay_within: Duration,
        /// Overwrite existing stock on both sides (refused once orders exist)
        #[arg(long, requires = "reason")]
        force: bool,
        /// Why (kept in the audit log); required with --force, which
        /// re-seeds stock under a running sale
        #[arg(long)]
        reason: Option<String>,
        #[arg(long, short, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// Show both sides of an activity's stock
    Show {
        #[arg(long)]
        activity: ActivityId,
        #[arg(long, short, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// After Redis lost an activity's state: wait for the order consumer's
    /// backlog to drain, rebuild the stock and buyers from PostgreSQL, and
    /// reopen the activity under a new epoch (audited in redis_epochs)
    Restore {
        #[arg(long)]
        activity: ActivityId,
        /// Why (kept with the new epoch)
        #[arg(long)]
        reason: String,
        /// Who is restoring [default: $USER]
        #[arg(long)]
        operator: Option<String>,
        /// How long to wait for the order consumer's backlog to drain
        #[arg(long, value_parser = crate::parse::duration, default_value = "120s")]
        wait: Duration,
        #[arg(long, short, value_enum, default_value_t)]
        output: OutputFormat,
    },
}

impl Tabular for RestoreReport {
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table(["SKU", "REDIS STOCK (FROM PG AVAILABLE)"]);
        for (sku, stock) in &self.stock {
            t.add_row([sku.to_string(), stock.to_string()]);
        }
        t
    }

    fn footer(&self) -> Vec<String> {
        let found = self
            .redis_epoch_found
            .map_or("no epoch".to_owned(), |e| format!("epoch {e}"));
        vec![
            format!(
                "activity {} restored: epoch {} -> {} (Redis had {found}); {} buyer(s), {} unpaid order(s) re-armed for their cancel",
                self.activity_id, self.previous_epoch, self.epoch, self.buyers, self.live_orders
            ),
            format!(
                "{} compensation task(s) settled by the restore; {} accepted reservation(s) were lost unsent (accepted {}, decided {}): their status answers LOST",
                self.settled_compensations, self.lost_unsent, self.gap.accepted, self.gap.decided
            ),
            "reservations are admitted again; `seckillctl reconcile` checks the invariants".into(),
        ]
    }
}

impl Tabular for ActivityView {
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table([
            "SKU",
            "PG TOTAL",
            "PG AVAILABLE",
            "PG VALID ORDERS",
            "REDIS STOCK",
        ]);
        for s in &self.skus {
            t.add_row([
                s.sku_id.to_string(),
                s.pg_total.to_string(),
                s.pg_available.to_string(),
                s.pg_valid_orders.to_string(),
                s.redis_stock.map_or("-".into(), |v| v.to_string()),
            ]);
        }
        t
    }

    fn footer(&self) -> Vec<String> {
        vec![format!(
            "activity {}: valid for {} s, pay within {} s; Redis live reservations {}, pending sends {}",
            self.activity_id,
            self.valid_for_ms / 1000,
            self.pay_within_ms / 1000,
            self.redis_live_reservations,
            self.redis_pending
        )]
    }
}

pub async fn run(cmd: ActivityCmd, cfg: &Config, rt: Arc<ClientRuntime>) -> Result<()> {
    match &cmd {
        ActivityCmd::Create { .. } => crate::access::writable(cfg, "activity create")?,
        ActivityCmd::Restore { .. } => crate::access::writable(cfg, "activity restore")?,
        ActivityCmd::Show { .. } => {}
    }
    let pool = db::connect(cfg).await?;
    let store = ReservationStore::new(redis_conn::connect(cfg).await?, cfg.redis_prefix.clone());
    let (view, output) = match cmd {
        ActivityCmd::Restore {
            activity,
            reason,
            operator,
            wait,
            output,
        } => {
            let req = RestoreRequest {
                activity,
                operator: operator
                    .or_else(|| std::env::var("USER").ok())
                    .unwrap_or_else(|| "unknown".into()),
                reason,
            };
            // Redis and PostgreSQL both change: an intent row first, the
            // outcome after (docs/security.md, "What is audited").
            let actor = Actor::database_url(&req.operator, Via::Direct);
            let before = activity::show(&pool, &store, activity).await.ok();
            let entry = audit::Entry::new("activity restore", vec![activity.to_string()])
                .reason(Some(req.reason.as_str()))
                .before(&before);
            let id = audit::open(&pool, &actor, &entry).await?;
            let done = restore(cfg, rt, &pool, &store, &req, wait).await;
            audit::finish(&pool, id, &done).await?;
            return render(&mut std::io::stdout().lock(), output, &done?);
        }
        ActivityCmd::Create {
            activity,
            sku,
            stock,
            valid_for,
            pay_within,
            force,
            reason,
            output,
        } => {
            let a = NewActivity {
                activity,
                sku,
                stock,
                valid_for_ms: valid_for.as_millis() as i64,
                pay_within_ms: pay_within.as_millis() as i64,
                force,
            };
            let command = if force {
                "activity create --force"
            } else {
                "activity create"
            };
            let before = activity::show(&pool, &store, activity).await.ok();
            let entry = audit::Entry::new(command, vec![activity.to_string(), sku.to_string()])
                .reason(reason.as_deref())
                .before(&before);
            let id = audit::open(&pool, &crate::access::direct(), &entry).await?;
            let done = activity::create(&pool, &store, &a).await;
            audit::finish(&pool, id, &done).await?;
            (done?, output)
        }
        ActivityCmd::Show { activity, output } => {
            (activity::show(&pool, &store, activity).await?, output)
        }
    };
    render(&mut std::io::stdout().lock(), output, &view)
}

/// Checks first that there is something to restore, then waits until the
/// order consumer has no message left (its topic and its retry topic,
/// twice in a row: offsets are committed every few seconds), so every
/// message already in flight is decided before PostgreSQL is read.
async fn restore(
    cfg: &Config,
    rt: Arc<ClientRuntime>,
    pool: &sqlx::PgPool,
    store: &ReservationStore,
    req: &RestoreRequest,
    wait: Duration,
) -> Result<RestoreReport> {
    if req.reason.trim().is_empty() {
        bail!(redis_state::RedisStateError::BlankReason);
    }
    match redis_state::survey_one(pool, store, req.activity).await? {
        None => bail!(redis_state::RedisStateError::NotSeeded(req.activity)),
        Some(s) if !s.state.refuses() => bail!(redis_state::RedisStateError::Intact {
            activity: req.activity,
            pg: s.pg_epoch,
            redis: s.redis_epoch.unwrap_or_default(),
        }),
        Some(_) => {}
    }
    let admin = RocketAdmin::start(rt, &cfg.namesrv_addr, cfg.admin_timeout()).await?;
    let drained = wait_for_drain(&admin, cfg, wait).await;
    admin.shutdown().await;
    drained?;
    Ok(redis_state::restore(pool, store, req).await?)
}

async fn wait_for_drain(admin: &RocketAdmin, cfg: &Config, wait: Duration) -> Result<()> {
    let names = Names::new(cfg.topic_prefix.clone());
    let group = names.group(TopicKind::OrderCreate);
    let topics = [names.topic(TopicKind::OrderCreate), retry_topic(&group)];
    let deadline = Instant::now() + wait;
    let mut empty_in_a_row = 0;
    loop {
        let mut left = 0;
        for topic in &topics {
            // A retry topic appears only with the first retry.
            match admin.lag(topic, &group).await {
                Ok(lag) => left += lag.messages.max(0),
                Err(_) if topic != &topics[0] => {}
                Err(e) => return Err(e).context("reading the order consumer's lag"),
            }
        }
        empty_in_a_row = if left == 0 { empty_in_a_row + 1 } else { 0 };
        if empty_in_a_row >= 2 {
            return Ok(());
        }
        if Instant::now() >= deadline {
            bail!(
                "the order consumer still has {left} message(s) to decide after {wait:?}; is an engine running (`seckillctl backlog`)? Restoring now could count their reservations twice; try again with a longer --wait"
            );
        }
        eprintln!("waiting for the order consumer's backlog: {left} message(s) left");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}
