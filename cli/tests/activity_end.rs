//! `seckillctl activity end` as a script sees it (docs/architecture.md
//! §16.3): its JSON and exit codes over the break-glass path, and through
//! a running engine's operator API, where a reader token is refused.

use anyhow::Result;
use seckill_engine::{ActivityId, NewActivity, Role, SkuId, activity};
use seckill_tests::{Engine, Setup, TestEnv, run};

const BIN: &str = env!("CARGO_BIN_EXE_seckillctl");

async fn seed(env: &TestEnv, a: ActivityId) -> Result<()> {
    activity::create(
        &env.pool,
        &env.store(),
        &NewActivity {
            activity: a,
            sku: SkuId(1),
            stock: 5,
            valid_for_ms: 300_000,
            pay_within_ms: 900_000,
            force: false,
        },
    )
    .await?;
    Ok(())
}

#[test]
fn activity_end_direct_says_when_and_exits_by_the_contract() {
    run(Setup::Full, |env| async move {
        seed(&env, ActivityId(51)).await?;
        let conf = std::env::temp_dir().join(format!("seckill-end-{}.toml", env.token));
        let end = |args: &[&str]| {
            let mut cmd = env.seckillctl(BIN, &conf).expect("the command");
            cmd.args(["--direct", "activity", "end"]).args(args);
            cmd
        };
        let out = end(&[
            "--activity",
            "51",
            "--in",
            "10m",
            "--reason",
            "sold out",
            "-o",
            "json",
        ])
        .output()
        .await?;
        assert_eq!(out.status.code(), Some(0), "{out:?}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        assert_eq!(v["activity_id"], 51, "{v}");
        assert_eq!(v["already_ended"], false, "{v}");
        let at: chrono::DateTime<chrono::Utc> = v["ends_at"].as_str().unwrap_or("").parse()?;
        let ahead = at - chrono::Utc::now();
        assert!(
            ahead.num_seconds() > 500 && ahead.num_seconds() <= 600,
            "{v}"
        );
        // Now, which is earlier: the end moves up.
        let out = end(&["--activity", "51", "--reason", "now", "-o", "json"])
            .output()
            .await?;
        let now: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        assert_eq!(now["already_ended"], false, "{now}");
        // An unknown activity and a missing reason are the caller's to fix.
        let out = end(&["--activity", "999", "--reason", "x"])
            .output()
            .await?;
        assert_eq!(out.status.code(), Some(64), "{out:?}");
        assert!(String::from_utf8_lossy(&out.stderr).contains("does not exist"));
        let out = end(&["--activity", "51"]).output().await?;
        assert_eq!(out.status.code(), Some(64), "{out:?}");
        let out = end(&["--activity", "51", "--reason", "  "])
            .output()
            .await?;
        assert_eq!(out.status.code(), Some(64), "{out:?}");
        let rows = env.audit_of("51").await?;
        assert!(
            rows.iter()
                .any(|r| r.command == "activity end" && r.via == "direct"),
            "{rows:?}"
        );
        Ok(())
    });
}

#[test]
fn activity_end_through_the_engine_needs_an_operator() {
    run(Setup::Full, |env| async move {
        seed(&env, ActivityId(52)).await?;
        // Issued before the engine starts: its gate loads the tokens.
        let mut tokens = Vec::new();
        for (role, code) in [(Role::Reader, 77), (Role::Operator, 0)] {
            tokens.push((
                role,
                code,
                env.issue_token(&format!("t-{}", role.as_str()), role)
                    .await?,
            ));
        }
        let engine = Engine::start(&env, env.cfg.clone()).await?;
        let conf = std::env::temp_dir().join(format!("seckill-end-api-{}.toml", env.token));
        let url = format!("http://{}", engine.addr);
        for (role, code, token) in tokens {
            let out = env
                .seckillctl(BIN, &conf)?
                .env("SECKILL_ENGINE_URL", &url)
                .env("SECKILL_TOKEN", &token)
                .args([
                    "activity",
                    "end",
                    "--activity",
                    "52",
                    "--reason",
                    "over",
                    "-o",
                    "json",
                ])
                .output()
                .await?;
            assert_eq!(out.status.code(), Some(code), "{role:?}: {out:?}");
        }
        let ended = activity::show(&env.pool, &env.store(), ActivityId(52)).await?;
        assert!(ended.ends_at.is_some(), "{ended:?}");
        engine.stop().await
    });
}
