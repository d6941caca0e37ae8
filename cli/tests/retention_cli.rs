//! `seckillctl db prune` (docs/architecture.md §16.2) against a real
//! PostgreSQL: bad input exits 64 naming the fix (below the floor, no
//! reason, a bad age, a `[retention]` section below the floor), a dry run
//! counts without deleting, and a real run deletes in batches, says so on
//! stderr and writes its operator_audit row.

use anyhow::{Result, ensure};
use seckill_tests::{Setup, TestEnv, run};
use std::process::Output;

/// `seckillctl ARGS` against this test's stores, with `extra` appended to
/// its config file.
async fn seckillctl(env: &TestEnv, extra: &str, args: &[&str]) -> Result<Output> {
    let conf = std::env::temp_dir().join(format!("seckill-retention-{}.toml", env.token));
    let mut cmd = env.seckillctl(env!("CARGO_BIN_EXE_seckillctl"), &conf)?;
    if !extra.is_empty() {
        let mut text = std::fs::read_to_string(&conf)?;
        text.push_str(extra);
        std::fs::write(&conf, text)?;
    }
    Ok(cmd.args(args).output().await?)
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

/// Finished inbox rows 20 days old, one PROCESSING as old, and a SENT
/// outbox row as old.
async fn old_rows(env: &TestEnv) -> Result<()> {
    for (id, status) in [
        ("m-1", "SUCCEEDED"),
        ("m-2", "SUCCEEDED"),
        ("m-3", "REJECTED"),
        ("m-4", "PROCESSING"),
    ] {
        sqlx::query(
            "INSERT INTO consumer_inbox (consumer_group, message_id, status, created_at, updated_at)
             VALUES ('G', $1, $2::inbox_status, now() - interval '20 days', now() - interval '20 days')",
        )
        .bind(id)
        .bind(status)
        .execute(&env.pool)
        .await?;
    }
    sqlx::query(
        "INSERT INTO event_outbox (message_id, topic, tag, message_key, payload, status, created_at, sent_at)
         VALUES ('o-1', 'T', 'CANCEL', 'k', '{}', 'SENT', now() - interval '20 days', now() - interval '20 days')",
    )
    .execute(&env.pool)
    .await?;
    Ok(())
}

async fn count(env: &TestEnv, sql: &str) -> Result<i64> {
    Ok(sqlx::query_scalar(sql).fetch_one(&env.pool).await?)
}

#[test]
fn bad_input_exits_64_naming_the_fix() {
    run(Setup::Full, |env| async move {
        old_rows(&env).await?;
        let below = seckillctl(
            &env,
            "",
            &["db", "prune", "--older-than", "2d", "--reason", "x"],
        )
        .await?;
        ensure!(below.status.code() == Some(64), "{below:?}");
        let why = stderr(&below);
        ensure!(
            why.contains("--older-than 48h")
                && why.contains("floor of 72 h")
                && why.contains("keep at least 72h"),
            "{why}"
        );
        let no_reason = seckillctl(&env, "", &["db", "prune", "--older-than", "14d"]).await?;
        ensure!(no_reason.status.code() == Some(64), "{no_reason:?}");
        ensure!(
            stderr(&no_reason).contains("--reason is required"),
            "{}",
            stderr(&no_reason)
        );
        let blank = seckillctl(
            &env,
            "",
            &["db", "prune", "--older-than", "14d", "--reason", " "],
        )
        .await?;
        ensure!(blank.status.code() == Some(64), "{blank:?}");
        let bad_age = seckillctl(
            &env,
            "",
            &["db", "prune", "--older-than", "14x", "--reason", "x"],
        )
        .await?;
        ensure!(bad_age.status.code() == Some(64), "{bad_age:?}");
        ensure!(stderr(&bad_age).contains("14d"), "{}", stderr(&bad_age));
        let bad_table = seckillctl(
            &env,
            "",
            &[
                "db",
                "prune",
                "--older-than",
                "14d",
                "--table",
                "operator_audit",
                "--reason",
                "x",
            ],
        )
        .await?;
        ensure!(bad_table.status.code() == Some(64), "{bad_table:?}");
        ensure!(
            stderr(&bad_table).contains("never pruned"),
            "{}",
            stderr(&bad_table)
        );
        // The automatic prune's section is held to the same floor.
        let section = seckillctl(
            &env,
            "[retention]\nkeep_hours = 48\n",
            &[
                "db",
                "prune",
                "--older-than",
                "14d",
                "--dry-run",
                "--reason",
                "x",
            ],
        )
        .await?;
        ensure!(section.status.code() == Some(64), "{section:?}");
        ensure!(
            stderr(&section).contains("keep_hours = 48")
                && stderr(&section).contains("floor of 72 h"),
            "{}",
            stderr(&section)
        );
        ensure!(
            count(&env, "SELECT count(*) FROM consumer_inbox").await? == 4,
            "nothing was deleted"
        );
        ensure!(count(&env, "SELECT count(*) FROM retention_marks").await? == 0);
        Ok(())
    });
}

#[test]
fn a_dry_run_counts_and_a_real_run_deletes_and_is_audited() {
    run(Setup::Full, |env| async move {
        old_rows(&env).await?;
        let dry = seckillctl(
            &env,
            "",
            &[
                "db",
                "prune",
                "--older-than",
                "14d",
                "--dry-run",
                "--reason",
                "look first",
                "-o",
                "json",
            ],
        )
        .await?;
        ensure!(dry.status.code() == Some(0), "{dry:?}");
        let json: serde_json::Value = serde_json::from_slice(&dry.stdout)?;
        ensure!(
            json["dry_run"] == true && json["keep_hours"] == 336,
            "{json:#}"
        );
        let tables = json["tables"].as_array().cloned().unwrap_or_default();
        let of = |name: &str| {
            tables
                .iter()
                .find(|t| t["table"] == name)
                .cloned()
                .unwrap_or_default()
        };
        ensure!(
            of("inbox")["rows"] == 3 && of("outbox")["rows"] == 1 && of("failures")["rows"] == 0,
            "{json:#}"
        );
        ensure!(of("inbox")["horizon"].is_string(), "{json:#}");
        ensure!(
            count(&env, "SELECT count(*) FROM consumer_inbox").await? == 4,
            "a dry run deletes nothing"
        );
        ensure!(
            count(&env, "SELECT count(*) FROM retention_marks").await? == 0,
            "nor marks"
        );
        ensure!(
            count(
                &env,
                "SELECT count(*) FROM operator_audit WHERE command = 'db prune'"
            )
            .await?
                == 0,
            "nor audits"
        );

        let real = seckillctl(
            &env,
            "",
            &[
                "db",
                "prune",
                "--older-than",
                "14d",
                "--table",
                "inbox",
                "--batch",
                "2",
                "--reason",
                "two weeks are enough",
                "-o",
                "json",
            ],
        )
        .await?;
        ensure!(real.status.code() == Some(0), "{real:?}");
        let json: serde_json::Value = serde_json::from_slice(&real.stdout)?;
        let tables = json["tables"].as_array().cloned().unwrap_or_default();
        ensure!(tables.len() == 1, "--table inbox: {json:#}");
        let t = &tables[0];
        ensure!(
            t["table"] == "inbox" && t["rows"] == 3 && t["batches"] == 2 && t["finished"] == true,
            "{json:#}"
        );
        ensure!(
            json["dry_run"] == false && json["stopped"] == false,
            "{json:#}"
        );
        let progress = stderr(&real);
        ensure!(
            progress.contains("consumer_inbox: batch 1 deleted 2 row(s)")
                && progress.contains("batch 2 deleted 1 row(s), 3 so far"),
            "progress on stderr: {progress}"
        );
        let left: Vec<String> = sqlx::query_scalar("SELECT message_id FROM consumer_inbox")
            .fetch_all(&env.pool)
            .await?;
        ensure!(left == ["m-4"], "PROCESSING stays: {left:?}");
        ensure!(
            count(&env, "SELECT count(*) FROM event_outbox").await? == 1,
            "--table inbox leaves the outbox alone"
        );
        let audit = env.audit_of("consumer_inbox").await?;
        ensure!(audit.len() == 1, "{audit:?}");
        let a = &audit[0];
        ensure!(
            a.command == "db prune"
                && a.outcome == "PRUNED"
                && a.reason.as_deref() == Some("two weeks are enough")
                && a.via == "bootstrap"
                && a.finished_at.is_some(),
            "{a:?}"
        );
        let after = a.after.clone().unwrap_or_default();
        ensure!(after["tables"][0]["rows"] == 3, "{after:#}");
        Ok(())
    });
}
