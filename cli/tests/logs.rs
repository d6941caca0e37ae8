//! The daemon's logs (docs/architecture.md §11.3): under a service manager
//! or a pipe, `seckillctl engine run` writes one JSON object per line, the
//! event's fields beside `timestamp`, `level` and `message`, so `jq` can
//! select on them.

use anyhow::{Context, bail, ensure};
use seckill_engine::{ActivityId, Role, SkuId};
use seckill_tests::{Setup, TestEnv, run};
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};

#[test]
fn the_daemon_logs_json_lines_when_its_stdout_is_not_a_terminal() {
    run(Setup::Full, |env| async move {
        let (mut daemon, conf) = spawn(&env, "info")?;
        let stderr = daemon.stderr.take().context("the daemon's stderr")?;
        let mut lines = BufReader::new(stderr).lines();
        let mut read = 0;
        let serving = tokio::time::timeout(Duration::from_secs(60), async {
            while let Some(line) = lines.next_line().await? {
                read += 1;
                let event: serde_json::Value = serde_json::from_str(&line)
                    .with_context(|| format!("line {read} is not JSON: {line}"))?;
                if event["message"] == "engine serving" {
                    return Ok(event);
                }
            }
            bail!("the daemon's log ended before it served")
        })
        .await
        .context("no `engine serving` line within 60 s")??;
        ensure!(serving["level"] == "INFO", "{serving}");
        ensure!(serving["timestamp"].is_string(), "{serving}");
        ensure!(
            serving["addr"]
                .as_str()
                .is_some_and(|a| a.starts_with("127.0.0.1:")),
            "the event's own field at the top level: {serving}"
        );
        ensure!(read > 1, "only {read} line(s) before serving");
        daemon.start_kill()?;
        let _ = daemon.wait().await;
        let _ = std::fs::remove_file(&conf);
        Ok(())
    });
}

/// The daemon, logging at `log` with the default format (JSON: its stdout
/// is a pipe), and its config file.
fn spawn(env: &TestEnv, log: &str) -> anyhow::Result<(tokio::process::Child, std::path::PathBuf)> {
    let conf = std::env::temp_dir().join(format!("seckill-logs-{}-{}.toml", env.token, log.len()));
    let daemon = env
        .seckillctl(env!("CARGO_BIN_EXE_seckillctl"), &conf)?
        .args(["--log", log, "engine", "run", "--listen", "127.0.0.1:0"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()?;
    Ok((daemon, conf))
}

/// docs/architecture.md §11.3 and §11.5: at DEBUG, one reservation's trace
/// id is on its lines at every stage, from ingress to the order event the
/// projection settled, each with the fields that apply.
#[test]
fn one_trace_id_follows_a_reservation_through_every_stage() {
    run(Setup::Full, |env| async move {
        env.seed_activity(ActivityId(5), SkuId(1), 10, 300_000)
            .await?;
        let token = env.issue_token("edge", Role::Ingress).await?;
        let (mut daemon, conf) = spawn(&env, "seckill_engine=debug,warn")?;
        let stderr = daemon.stderr.take().context("the daemon's stderr")?;
        let mut lines = BufReader::new(stderr).lines();
        let trace = "4bf92f3577b34da6a3ce929d0e0e4736";
        let mut stages = std::collections::BTreeMap::new();
        let found = tokio::time::timeout(Duration::from_secs(90), async {
            while let Some(line) = lines.next_line().await? {
                let event: serde_json::Value = serde_json::from_str(&line)
                    .with_context(|| format!("not JSON: {line}"))?;
                if event["message"] == "engine serving" {
                    let addr = event["addr"].as_str().context("addr")?.to_owned();
                    let r = reqwest::Client::new()
                        .post(format!("http://{addr}/v1/activities/5/skus/1/reservations"))
                        .bearer_auth(&token)
                        .header("traceparent", format!("00-{trace}-00f067aa0ba902b7-01"))
                        .json(&serde_json::json!({"user_id": 7, "request_id": seckill_engine::RequestId::generate().as_str()}))
                        .send()
                        .await?;
                    ensure!(r.status().as_u16() == 202, "reserve: {}", r.status());
                }
                if event["trace_id"] == trace {
                    let stage = event["stage"].as_str().unwrap_or("?").to_owned();
                    stages.insert(stage, event);
                    if ["ingress", "publish", "consume", "lifecycle"]
                        .iter()
                        .all(|s| stages.contains_key(*s))
                    {
                        return Ok(());
                    }
                }
            }
            bail!("the daemon's log ended")
        })
        .await;
        daemon.start_kill()?;
        let _ = daemon.wait().await;
        let _ = std::fs::remove_file(&conf);
        found.with_context(|| format!("stages seen with trace {trace}: {:?}", stages.keys()))??;
        for stage in ["ingress", "publish", "consume", "lifecycle"] {
            let e = stages
                .get(stage)
                .with_context(|| format!("no {stage} line"))?;
            ensure!(e["reservation_id"].is_string(), "{stage}: {e}");
            ensure!(e["outcome"].is_string(), "{stage}: {e}");
        }
        let consumed = &stages["consume"];
        for field in [
            "message_id",
            "order_id",
            "activity_id",
            "sku_id",
            "user_id",
            "topic",
            "queue",
            "offset",
            "retry_count",
            "replay_count",
            "latency_ms",
        ] {
            ensure!(
                !consumed[field].is_null(),
                "consume line without {field}: {consumed}"
            );
        }
        ensure!(consumed["outcome"] == "CREATED", "{consumed}");
        Ok(())
    });
}
