//! The faults a drill or a chaos run injects, each injected and healed
//! here: the drills name one at a fixed moment, chaos draws a schedule of
//! them (docs/architecture.md §13.5).

use super::proxy::Link;
use super::servers::World;
use super::stage::Stage;
use anyhow::{Context, Result};
use serde::Serialize;
use std::time::Duration;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "fault", content = "engine", rename_all = "kebab-case")]
pub enum Fault {
    /// kill -9 of engine N, then a restart.
    KillEngine(usize),
    /// kill -9 of the broker, started again 5 s later on its store.
    RestartBroker,
    /// Replies lost for 3 s (requests still stored), then the link down for 2 s.
    CutLink,
    /// An outside session holds the SKU's inventory row for 8 s.
    LockSku,
}

impl Fault {
    pub fn label(self) -> String {
        match self {
            Fault::KillEngine(i) => format!("kill engine {i}"),
            Fault::RestartBroker => "restart broker".to_owned(),
            Fault::CutLink => "cut link".to_owned(),
            Fault::LockSku => "lock sku".to_owned(),
        }
    }
}

/// Injects `fault`, heals it, and says what happened.
pub async fn apply(fault: Fault, world: &mut World, stage: &mut Stage) -> Result<String> {
    match fault {
        Fault::KillEngine(i) => {
            let pid = stage.kill_engine(i).await;
            stage.start_engine(i).await?;
            Ok(match pid {
                Some(pid) => format!("engine {i} (pid {pid}) killed and restarted"),
                None => format!("engine {i} was not running; started"),
            })
        }
        Fault::RestartBroker => restart_broker(world, async { Ok(None) }).await,
        Fault::CutLink => {
            world.set_link(Link::RepliesLost);
            tokio::time::sleep(Duration::from_secs(3)).await;
            world.set_link(Link::Down);
            tokio::time::sleep(Duration::from_secs(2)).await;
            world.set_link(Link::Up);
            Ok("broker replies lost 3 s, link down 2 s".to_owned())
        }
        Fault::LockSku => {
            hold_sku_row(stage, Duration::from_secs(8)).await?;
            Ok("inventory row held for 8 s".to_owned())
        }
    }
}

/// kill -9 of the broker, started again 5 s later; `while_down` runs 2 s
/// into the outage and may add to the report.
pub async fn restart_broker(
    world: &mut World,
    while_down: impl std::future::Future<Output = Result<Option<String>>>,
) -> Result<String> {
    world.kill_broker().await;
    tokio::time::sleep(Duration::from_secs(2)).await;
    let seen = while_down.await?;
    tokio::time::sleep(Duration::from_secs(3)).await;
    world.start_broker().await?;
    Ok(match seen {
        Some(seen) => format!("{seen}; broker killed, answering again 5 s later"),
        None => "broker killed, answering again 5 s later".to_owned(),
    })
}

/// An outside session locks the SKU's inventory row for `hold`, then lets go.
pub async fn hold_sku_row(stage: &Stage, hold: Duration) -> Result<()> {
    let mut tx = stage.pool.begin().await?;
    sqlx::query("SELECT 1 FROM inventory WHERE activity_id = $1 AND sku_id = $2 FOR UPDATE")
        .bind(stage.activity)
        .bind(stage.sku)
        .execute(&mut *tx)
        .await
        .context("lock the inventory row")?;
    tokio::time::sleep(hold).await;
    tx.rollback().await?;
    Ok(())
}
