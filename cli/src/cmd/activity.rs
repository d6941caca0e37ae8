//! `seckillctl activity create|show|restore|end`. Create, end and restore go
//! through the engine's operator API with the CLI's token (docs/security.md:
//! create is an operator's, a forced re-seed and a restore an admin's);
//! `--direct` runs the same library calls over the database URL, audited
//! as direct.

use crate::exit::UsageError;
use crate::output::{OutputFormat, Tabular, new_table, render};
use anyhow::{Result, bail};
use seckill_engine::{
    ActivityBody, ActivityId, ActivityView, ClientRuntime, Config, EndBody, EndView, MAX_VERIFY_MS,
    Names, ReservationStore, RestoreBody, RestoreOn, RestoreReport, RestoreRequest, RocketAdmin,
    SkuId, activity, db, redis_conn, restore_audited,
};
use std::sync::Arc;
use std::time::Duration;

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
    /// End a sale: from then on (at most 5 s later on every engine) new
    /// reservations get 410 ACTIVITY_ENDED, a retried request_id still gets
    /// its reservation; once every order is decided the sweeps retire the
    /// activity from Redis (audited)
    End {
        #[arg(long)]
        activity: ActivityId,
        /// End this long from now rather than now
        #[arg(long = "in", value_parser = crate::parse::duration, default_value = "0s")]
        within: Duration,
        /// Why (kept in the audit log)
        #[arg(long)]
        reason: String,
        #[arg(long, short, value_enum, default_value_t)]
        output: OutputFormat,
    },
    /// After Redis lost an activity's state: wait for the order consumer's
    /// backlog to drain, rebuild the stock and buyers from PostgreSQL, and
    /// reopen the activity under a new epoch (audited in redis_epochs)
    Restore {
        #[arg(long)]
        activity: ActivityId,
        /// Why (kept with the new epoch and in the audit log)
        #[arg(long)]
        reason: String,
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

impl Tabular for EndView {
    fn table(&self) -> comfy_table::Table {
        let mut t = new_table(["ACTIVITY", "ENDS AT"]);
        t.add_row([
            self.activity_id.to_string(),
            self.ends_at.format("%Y-%m-%d %H:%M:%S%.3f UTC").to_string(),
        ]);
        t
    }

    fn footer(&self) -> Vec<String> {
        let said = if self.already_ended {
            "it was already ended no later than that; nothing changed"
        } else {
            "every engine refuses new reservations from then on (within 5 s); the sweeps retire it from Redis once every order is decided"
        };
        vec![format!("activity {}: {said}", self.activity_id)]
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
        let mut lines = vec![format!(
            "activity {}: valid for {} s, pay within {} s; Redis live reservations {}, pending sends {}",
            self.activity_id,
            self.valid_for_ms / 1000,
            self.pay_within_ms / 1000,
            self.redis_live_reservations,
            self.redis_pending
        )];
        let at = |t: &chrono::DateTime<chrono::Utc>| t.format("%Y-%m-%d %H:%M:%S UTC").to_string();
        match (&self.ends_at, &self.retired_at) {
            (_, Some(r)) => lines.push(format!("ended and retired from Redis at {}", at(r))),
            (Some(e), None) => lines.push(format!("the sale ends (or ended) at {}", at(e))),
            (None, None) => {}
        }
        lines
    }
}

pub async fn run(cmd: ActivityCmd, cfg: &Config, rt: Arc<ClientRuntime>) -> Result<()> {
    match &cmd {
        ActivityCmd::Create { .. } => crate::access::writable(cfg, "activity create")?,
        ActivityCmd::Restore { .. } => crate::access::writable(cfg, "activity restore")?,
        ActivityCmd::End { .. } => crate::access::writable(cfg, "activity end")?,
        ActivityCmd::Show { .. } => {}
    }
    // Mutations go through the engine's operator API with the CLI's token
    // (docs/security.md); --direct breaks glass over the database URL.
    if !cfg.auth.direct {
        match cmd {
            ActivityCmd::Create { .. } => {
                let (body, output) = create_body(cmd);
                let reply = crate::remote::post(cfg, "/v1/ops/activities", &body).await?;
                let view: ActivityView = crate::remote::answer(reply)?;
                return render(&mut std::io::stdout().lock(), output, &view);
            }
            ActivityCmd::Restore {
                activity,
                reason,
                wait,
                output,
            } => {
                let body = RestoreBody {
                    reason,
                    wait_ms: u64::try_from(wait.as_millis()).unwrap_or(u64::MAX),
                };
                if body.wait_ms > MAX_VERIFY_MS {
                    bail!(UsageError(format!(
                        "--wait {wait:?} is over the operator API's cap of {} s; use --direct for longer",
                        MAX_VERIFY_MS / 1000
                    )));
                }
                eprintln!(
                    "restoring activity {activity} through the engine: it waits up to {wait:?} for the order consumer's backlog"
                );
                let path = format!("/v1/ops/activities/{activity}/restore");
                let within = wait + Duration::from_secs(30);
                let reply = crate::remote::post_within(cfg, &path, &body, within).await?;
                let report: RestoreReport = crate::remote::answer(reply)?;
                return render(&mut std::io::stdout().lock(), output, &report);
            }
            ActivityCmd::End {
                activity,
                within,
                reason,
                output,
            } => {
                let body = EndBody {
                    in_ms: u64::try_from(within.as_millis()).unwrap_or(u64::MAX),
                    reason,
                };
                let path = format!("/v1/ops/activities/{activity}/end");
                let reply = crate::remote::post(cfg, &path, &body).await?;
                let view: EndView = crate::remote::answer(reply)?;
                return render(&mut std::io::stdout().lock(), output, &view);
            }
            ActivityCmd::Show { .. } => {}
        }
    }
    let pool = db::connect(cfg).await?;
    let store = ReservationStore::new(redis_conn::connect(cfg).await?, cfg.redis_prefix.clone());
    let actor = crate::access::direct();
    match cmd {
        ActivityCmd::Restore {
            activity,
            reason,
            wait,
            output,
        } => {
            let req = RestoreRequest {
                activity,
                operator: actor.name.clone(),
                reason,
            };
            let admin = RocketAdmin::start(rt, &cfg.namesrv_addr, cfg.admin_timeout()).await?;
            let names = Names::new(cfg.topic_prefix.clone());
            let on = RestoreOn {
                pool: &pool,
                store: &store,
                admin: &admin,
                names: &names,
            };
            let done = restore_audited(&on, &req, &actor, wait, &|left| {
                eprintln!("waiting for the order consumer's backlog: {left} message(s) left");
            })
            .await;
            admin.shutdown().await;
            render(&mut std::io::stdout().lock(), output, &done?)
        }
        ActivityCmd::Create { .. } => {
            let (b, output) = create_body(cmd);
            let a = b.new_activity();
            let view =
                activity::create_audited(&pool, &store, &a, b.reason.as_deref(), &actor).await?;
            render(&mut std::io::stdout().lock(), output, &view)
        }
        ActivityCmd::End {
            activity,
            within,
            reason,
            output,
        } => {
            let view = activity::end_audited(&pool, activity, within, &reason, &actor).await?;
            render(&mut std::io::stdout().lock(), output, &view)
        }
        ActivityCmd::Show { activity, output } => render(
            &mut std::io::stdout().lock(),
            output,
            &activity::show(&pool, &store, activity).await?,
        ),
    }
}

/// `activity create`'s flags as the operator API's body.
fn create_body(cmd: ActivityCmd) -> (ActivityBody, OutputFormat) {
    let ActivityCmd::Create {
        activity,
        sku,
        stock,
        valid_for,
        pay_within,
        force,
        reason,
        output,
    } = cmd
    else {
        unreachable!("called for create only")
    };
    let ms = |d: Duration| i64::try_from(d.as_millis()).unwrap_or(i64::MAX);
    (
        ActivityBody {
            activity,
            sku,
            stock,
            valid_for_ms: ms(valid_for),
            pay_within_ms: ms(pay_within),
            force,
            reason,
        },
        output,
    )
}
