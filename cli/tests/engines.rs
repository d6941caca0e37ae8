//! The engine registry (docs/architecture.md §14.3): every daemon writes its
//! row on start and beats; `seckillctl engines` lists the live ones and the
//! dead, those stopped cleanly at once and those fallen silent after
//! `[registry] dead_after_ms`.

use anyhow::{Result, ensure};
use seckill_tests::{Engine, Setup, TestEnv, eventually, run};
use secrecy::ExposeSecret;
use std::time::Duration;

/// `seckillctl engines --output json` against this test's database.
async fn engines(env: &TestEnv) -> Result<Vec<serde_json::Value>> {
    let out = tokio::process::Command::new(env!("CARGO_BIN_EXE_seckillctl"))
        .args(["engines", "--output", "json"])
        .env_remove("SECKILL_CONFIG")
        .env("SECKILL_DATABASE_URL", env.cfg.database_url.expose_secret())
        .output()
        .await?;
    ensure!(
        out.status.success(),
        "engines: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    Ok(serde_json::from_slice(&out.stdout)?)
}

fn state_of(list: &[serde_json::Value], address: &str) -> Option<String> {
    list.iter()
        .find(|e| e["address"] == address)
        .and_then(|e| e["state"].as_str())
        .map(str::to_owned)
}

#[test]
fn engines_lists_every_daemon_live_or_dead() {
    run(Setup::Full, |env| async move {
        let a = Engine::start(&env, env.cfg.clone()).await?;
        let b = Engine::start(&env, env.cfg.clone()).await?;
        // A daemon killed a minute ago: its row stays, its heartbeat stopped.
        sqlx::query(
            "INSERT INTO engine_instances (engine_id, address, version, hostname, pid, started_at, heartbeat_at)
             VALUES ('engine-killed', '127.0.0.1:1', '0.0.9', 'elsewhere', 1, now() - interval '10 min', now() - interval '1 min')",
        )
        .execute(&env.pool)
        .await?;
        let (addr_a, addr_b) = (a.addr.to_string(), b.addr.to_string());
        let list = engines(&env).await?;
        ensure!(list.len() == 3, "{list:#?}");
        for e in &list {
            for field in ["id", "address", "version", "state"] {
                ensure!(e[field].is_string(), "{field} missing: {e}");
            }
        }
        ensure!(
            state_of(&list, &addr_a).as_deref() == Some("live"),
            "{list:#?}"
        );
        ensure!(
            state_of(&list, &addr_b).as_deref() == Some("live"),
            "{list:#?}"
        );
        let killed = list.iter().find(|e| e["id"] == "engine-killed");
        ensure!(
            killed.is_some_and(|e| e["state"] == "dead" && e["dead_because"] == "silent"),
            "{list:#?}"
        );
        ensure!(
            list[2]["id"] == "engine-killed",
            "live ones first: {list:#?}"
        );

        // A clean stop is dead at once, not after dead_after_ms.
        b.stop().await?;
        let list = engines(&env).await?;
        let b_row = list.iter().find(|e| e["address"] == addr_b.as_str());
        ensure!(
            b_row.is_some_and(|e| e["state"] == "dead" && e["dead_because"] == "stopped"),
            "{list:#?}"
        );
        // The live one keeps beating: its last heartbeat moves on.
        let first =
            seckill_engine::engines::list(&env.pool, &env.cfg.registry, chrono::Duration::hours(1))
                .await?;
        let beat = |v: &[seckill_engine::EngineView]| {
            v.iter()
                .find(|e| e.address == addr_a)
                .map(|e| e.heartbeat_at)
        };
        let before = beat(&first);
        eventually(Duration::from_secs(10), "a heartbeat", || async {
            let now = seckill_engine::engines::list(
                &env.pool,
                &env.cfg.registry,
                chrono::Duration::hours(1),
            )
            .await?;
            Ok((beat(&now) > before).then_some(()))
        })
        .await?;
        ensure!(state_of(&engines(&env).await?, &addr_a).as_deref() == Some("live"));
        a.stop().await
    });
}
