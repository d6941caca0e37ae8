//! `seckillctl activity create|show`.

use crate::output::{OutputFormat, Tabular, new_table, render};
use anyhow::Result;
use seckill_engine::{
    ActivityId, ActivityView, Config, NewActivity, ReservationStore, SkuId, activity, db,
    redis_conn,
};
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
        #[arg(long)]
        force: bool,
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

pub async fn run(cmd: ActivityCmd, cfg: &Config) -> Result<()> {
    let pool = db::connect(cfg).await?;
    let store = ReservationStore::new(redis_conn::connect(cfg).await?, cfg.redis_prefix.clone());
    let (view, output) = match cmd {
        ActivityCmd::Create {
            activity,
            sku,
            stock,
            valid_for,
            pay_within,
            force,
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
            (activity::create(&pool, &store, &a).await?, output)
        }
        ActivityCmd::Show { activity, output } => {
            (activity::show(&pool, &store, activity).await?, output)
        }
    };
    render(&mut std::io::stdout().lock(), output, &view)
}
