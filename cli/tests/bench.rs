//! `seckillctl bench flash-sale --plot` (docs/architecture.md §11.7): a
//! small real sale against a daemon, drawn as an SVG whose figures are
//! PostgreSQL's.

use anyhow::{Context, ensure};
use seckill_engine::{ActivityId, facts};
use seckill_tests::{Setup, eventually, run};
use std::process::Stdio;
use std::time::Duration;

#[test]
fn a_bench_draws_its_sale_and_the_plot_counts_what_postgresql_holds() {
    run(Setup::Full, |env| async move {
        let dir = std::env::temp_dir().join(format!("seckill-bench-{}", env.token));
        std::fs::create_dir_all(&dir)?;
        let (conf, log, svg) = (
            dir.join("seckill.toml"),
            dir.join("engine.log"),
            dir.join("sale.svg"),
        );
        let mut daemon = env
            .seckillctl(env!("CARGO_BIN_EXE_seckillctl"), &conf)?
            .args([
                "--log",
                "info",
                "--log-format",
                "json",
                "engine",
                "run",
                "--listen",
                "127.0.0.1:0",
            ])
            .stdout(Stdio::null())
            .stderr(std::fs::File::create(&log)?)
            .kill_on_drop(true)
            .spawn()?;
        let addr = eventually(Duration::from_secs(60), "`engine serving`", || async {
            Ok(std::fs::read_to_string(&log)?
                .lines()
                .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
                .find(|e| e["message"] == "engine serving")
                .and_then(|e| e["addr"].as_str().map(str::to_owned)))
        })
        .await?;

        eventually(Duration::from_secs(60), "the engine ready", || async {
            let r = reqwest::get(format!("http://{addr}/readyz")).await?;
            Ok(r.status().is_success().then_some(()))
        })
        .await?;
        let out = env
            .seckillctl(env!("CARGO_BIN_EXE_seckillctl"), &conf)?
            .args([
                "bench",
                "flash-sale",
                "--activity",
                "9",
                "--sku",
                "1",
                "--stock",
                "40",
            ])
            .args(["--users", "60", "--rate", "200", "--output", "json"])
            .arg("--engine")
            .arg(format!("http://{addr}"))
            .arg("--plot")
            .arg(&svg)
            .output()
            .await?;
        daemon.start_kill()?;
        let _ = daemon.wait().await;
        ensure!(
            out.status.success(),
            "bench: {}",
            String::from_utf8_lossy(&out.stderr)
        );

        let drawn = std::fs::read_to_string(&svg).context("the plot")?;
        ensure!(drawn.starts_with("<svg"), "not an SVG");
        for label in ["reservations/s", "orders/s", "backlog seconds", "p99.9"] {
            ensure!(drawn.contains(label), "no {label} in the plot");
        }
        // The plot's per-second figures add up to what PostgreSQL holds.
        let orders: i64 = sqlx::query_scalar("SELECT count(*) FROM orders WHERE activity_id = 9")
            .fetch_one(&env.pool)
            .await?;
        let reserved: i64 =
            sqlx::query_scalar("SELECT count(*) FROM reservations WHERE activity_id = 9")
                .fetch_one(&env.pool)
                .await?;
        let seconds = facts::timeline(
            &env.pool,
            ActivityId(9),
            chrono::Utc::now() - chrono::Duration::minutes(10),
        )
        .await?;
        ensure!(orders == 40, "the stock sold out: {orders} orders");
        ensure!(
            seconds.iter().map(|s| s.orders_created).sum::<i64>() == orders,
            "{seconds:?}"
        );
        ensure!(
            seconds.iter().map(|s| s.reserved).sum::<i64>() == reserved,
            "{seconds:?}"
        );
        ensure!(
            seconds
                .iter()
                .all(|s| s.orders_created == 0 || s.end_to_end_ms.is_some()),
            "every second with orders has its latency: {seconds:?}"
        );
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    });
}

#[test]
fn a_plot_into_a_missing_directory_is_refused_before_the_sale() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_seckillctl"))
        .args(["--database-url", "postgres://postgres@127.0.0.1:1/none"])
        .args([
            "bench",
            "flash-sale",
            "--activity",
            "1",
            "--sku",
            "1",
            "--stock",
            "1",
        ])
        .args([
            "--users",
            "1",
            "--rate",
            "1",
            "--plot",
            "/nonexistent-dir/sale.svg",
        ])
        .env_remove("SECKILL_CONFIG")
        .output()
        .expect("run seckillctl");
    assert!(!out.status.success(), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("/nonexistent-dir"), "{stderr}");
    assert!(stderr.contains("does not exist"), "{stderr}");
}
