//! The daemon's logs (docs/architecture.md §11.3): under a service manager
//! or a pipe, `seckillctl engine run` writes one JSON object per line, the
//! event's fields beside `timestamp`, `level` and `message`, so `jq` can
//! select on them.

use anyhow::{Context, bail, ensure};
use seckill_tests::{Setup, run};
use secrecy::ExposeSecret;
use std::process::Stdio;
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};

#[test]
fn the_daemon_logs_json_lines_when_its_stdout_is_not_a_terminal() {
    run(Setup::Full, |env| async move {
        let conf = std::env::temp_dir().join(format!("seckill-logs-{}.toml", env.token));
        std::fs::write(
            &conf,
            format!("redis_prefix = \"{}\"\n", env.cfg.redis_prefix),
        )?;
        let mut daemon = tokio::process::Command::new(env!("CARGO_BIN_EXE_seckillctl"))
            .arg("--config")
            .arg(&conf)
            .args(["--log", "info", "engine", "run", "--listen", "127.0.0.1:0"])
            .env_remove("SECKILL_LOG_FORMAT")
            .env_remove("SECKILL_CONFIG")
            .env("SECKILL_DATABASE_URL", env.cfg.database_url.expose_secret())
            .env("SECKILL_REDIS_URL", env.cfg.redis_url.expose_secret())
            .env("SECKILL_NAMESRV_ADDR", &env.cfg.namesrv_addr)
            .env("SECKILL_TOPIC_PREFIX", &env.cfg.topic_prefix)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .spawn()?;
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
