//! `seckillctl tui`: the live on-call screen (seckill-tui).

use anyhow::Result;
use seckill_engine::{ClientRuntime, Config};
use std::sync::Arc;
use std::time::Duration;

#[derive(Debug, clap::Args)]
pub struct TuiArgs {
    /// How often the screen samples the stack
    #[arg(long, value_parser = crate::parse::duration, default_value = "1s")]
    refresh: Duration,
}

pub async fn run(args: TuiArgs, cfg: &Config, rt: Arc<ClientRuntime>) -> Result<()> {
    if args.refresh < Duration::from_millis(200) {
        anyhow::bail!(crate::exit::UsageError(
            "--refresh must be at least 200ms; every refresh samples the whole stack".into()
        ));
    }
    seckill_tui::run(
        cfg.clone(),
        rt,
        seckill_tui::Options {
            refresh: args.refresh,
            // The global --readonly (or [auth] readonly): hide every key
            // that changes something.
            readonly: cfg.auth.readonly,
        },
    )
    .await
}
