//! The CLI's mutations go through the engine's operator API with the CLI's
//! token (docs/security.md): without a token, or with a role too low, they
//! are refused with exit 77 and nothing changes; with an operator token
//! they succeed and the audit row names the token; `--direct` breaks glass
//! over the database URL and is audited as such; `--readonly` refuses all.

use anyhow::{Result, ensure};
use seckill_engine::{ActivityId, Role, SkuId};
use seckill_tests::{Engine, Setup, TestEnv, run};
use secrecy::ExposeSecret;
use std::process::Output;

const ACTIVITY: ActivityId = ActivityId(26);
const SKU: SkuId = SkuId(1);

/// Runs the binary against this test's database and engine, with `token`.
async fn ctl(env: &TestEnv, engine: &Engine, token: Option<&str>, args: &[&str]) -> Output {
    let mut cmd = tokio::process::Command::new(env!("CARGO_BIN_EXE_seckillctl"));
    cmd.args(args)
        .env_remove("SECKILL_CONFIG")
        .env_remove("SECKILL_TOKEN")
        .env("SECKILL_DATABASE_URL", env.cfg.database_url.expose_secret())
        .env("SECKILL_REDIS_URL", env.cfg.redis_url.expose_secret())
        .env("SECKILL_NAMESRV_ADDR", &env.cfg.namesrv_addr)
        .env("SECKILL_TOPIC_PREFIX", &env.cfg.topic_prefix)
        .env("SECKILL_ENGINE_URL", format!("http://{}", engine.addr))
        .env("USER", "alice");
    if let Some(t) = token {
        cmd.env("SECKILL_TOKEN", t);
    }
    cmd.output().await.expect("run seckillctl")
}

/// An order of this test's activity, created through the engine.
async fn an_order(env: &TestEnv, engine: &Engine, user: i64) -> Result<String> {
    let queued: serde_json::Value = engine
        .http
        .post(format!(
            "http://{}/v1/activities/{}/skus/{}/reservations",
            engine.addr, ACTIVITY.0, SKU.0
        ))
        .json(&serde_json::json!({
            "user_id": user,
            "request_id": seckill_engine::RequestId::generate().as_str()
        }))
        .send()
        .await?
        .json()
        .await?;
    let order = queued["order_id"].as_str().unwrap_or_default().to_owned();
    env.order_created(&order).await?;
    Ok(order)
}

async fn status_of(env: &TestEnv, order: &str) -> Result<String> {
    let o = seckill_engine::order::get(&env.pool, &order.parse()?)
        .await?
        .expect("the order");
    Ok(o.status.to_string())
}

#[test]
fn a_cli_cancel_needs_an_operator_token_or_the_break_glass() {
    run(Setup::Full, |env| async move {
        env.seed_activity(ACTIVITY, SKU, 10, 300_000).await?;
        let reader = env.issue_token("cli-reader", Role::Reader).await?;
        let operator = env.issue_token("cli-operator", Role::Operator).await?;
        let engine = Engine::start(&env, env.cfg.clone()).await?;
        let cancel = |order: &str| {
            [
                "order",
                "cancel",
                "--order-id",
                order,
                "--reason",
                "suspected fraud",
            ]
            .map(str::to_owned)
        };
        let a = an_order(&env, &engine, 1).await?;
        let args = cancel(&a);
        let args: Vec<&str> = args.iter().map(String::as_str).collect();

        // No token, a reader's, or a read-only CLI: exit 77, nothing changed.
        for (token, readonly) in [
            (None, false),
            (Some(reader.as_str()), false),
            (Some(operator.as_str()), true),
        ] {
            let mut argv = args.clone();
            if readonly {
                argv.insert(0, "--readonly");
            }
            let out = ctl(&env, &engine, token, &argv).await;
            ensure!(
                out.status.code() == Some(77),
                "{token:?} readonly={readonly}: {out:?}"
            );
            ensure!(status_of(&env, &a).await? == "CREATED");
        }

        // An operator token: canceled, audited under the token.
        let out = ctl(&env, &engine, Some(&operator), &args).await;
        ensure!(out.status.success(), "{out:?}");
        ensure!(status_of(&env, &a).await? == "CANCELED");
        let rows = env.audit_of(&a).await?;
        ensure!(rows.len() == 1, "{rows:?}");
        ensure!(
            rows[0].actor == "cli-operator" && rows[0].via == "token",
            "{rows:?}"
        );

        // The break glass: over the database URL, no token, audited as direct.
        let b = an_order(&env, &engine, 2).await?;
        let args = cancel(&b);
        let mut argv: Vec<&str> = args.iter().map(String::as_str).collect();
        argv.insert(0, "--direct");
        let out = ctl(&env, &engine, None, &argv).await;
        ensure!(out.status.success(), "{out:?}");
        ensure!(status_of(&env, &b).await? == "CANCELED");
        let rows = env.audit_of(&b).await?;
        ensure!(rows.len() == 1, "{rows:?}");
        ensure!(
            rows[0].actor == "alice@database-url" && rows[0].via == "direct",
            "{rows:?}"
        );
        engine.stop().await
    });
}
