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

/// One mutating command, and who may run it.
struct Case {
    args: Vec<String>,
    /// The weakest role that may; the test's token of that role succeeds.
    right: Role,
    /// A role just below: refused with exit 77.
    lower: Role,
    /// The audit row it writes: a target it names, and its command.
    target: String,
    command: &'static str,
    /// Whether the state before exists to be recorded (a new activity has none).
    before: bool,
}

fn case(args: &[&str], right: Role, lower: Role, target: &str, command: &'static str) -> Case {
    Case {
        args: args.iter().map(|a| (*a).to_owned()).collect(),
        right,
        lower,
        target: target.to_owned(),
        command,
        before: true,
    }
}

/// The done-when of docs/security.md: every CLI mutation, refused without
/// a token, with a lower role and from a read-only CLI (exit 77, no audit
/// row, so nothing changed: every mutation writes one with its change),
/// then run with the right role, audited under the token with the state
/// before and after. A rehearsal changes nothing and keeps nothing: it is
/// refused the same ways, and audits nothing.
#[test]
fn every_cli_mutation_needs_its_role_and_is_audited_under_the_token() {
    run(Setup::Full, |env| async move {
        use seckill_engine::FailureClass;
        env.seed_activity(ACTIVITY, SKU, 10, 300_000).await?;
        let mut token = std::collections::HashMap::new();
        for r in Role::ALL {
            token.insert(r, env.issue_token(&format!("cli-{r}"), r).await?);
        }
        let engine = Engine::start(&env, env.cfg.clone()).await?;

        let to_pay = an_order(&env, &engine, 1).await?;
        let to_cancel = an_order(&env, &engine, 2).await?;
        let moved = env.open_ticket(FailureClass::Unknown).await?.to_string();
        let discarded = env.dead_order(None, ACTIVITY, SKU, 3).await?.to_string();
        let replayed = env.dead_order(None, ACTIVITY, SKU, 4).await?.to_string();
        let rehearsed = env.dead_order(None, ACTIVITY, SKU, 5).await?.to_string();
        let bulk = env.open_ticket(FailureClass::DbTimeout).await?;
        let in_bulk = env
            .dead_order(Some(&bulk), ACTIVITY, SKU, 6)
            .await?
            .to_string();
        env.dead_order(Some(&bulk), ACTIVITY, SKU, 7).await?;
        let bulk = bulk.to_string();
        let fresh = "27";

        use Role::*;
        let mut cases = vec![
            case(
                &["order", "pay", "--order-id", &to_pay],
                Payments,
                Operator,
                &to_pay,
                "order pay",
            ),
            case(
                &[
                    "order",
                    "cancel",
                    "--order-id",
                    &to_cancel,
                    "--reason",
                    "fraud",
                ],
                Operator,
                Reader,
                &to_cancel,
                "order cancel",
            ),
            case(
                &["dlq", "ticket", "ack", "--ticket", &moved],
                Operator,
                Reader,
                &moved,
                "dlq ticket ack",
            ),
            case(
                &[
                    "dlq", "ticket", "assign", "--ticket", &moved, "--owner", "bob",
                ],
                Operator,
                Reader,
                &moved,
                "dlq ticket assign",
            ),
            case(
                &["dlq", "ticket", "resolve", "--ticket", &moved],
                Operator,
                Reader,
                &moved,
                "dlq ticket resolve",
            ),
            case(
                &[
                    "dlq",
                    "ticket",
                    "close",
                    "--ticket",
                    &moved,
                    "--resolution",
                    "fixed the lock",
                ],
                Operator,
                Reader,
                &moved,
                "dlq ticket close",
            ),
            case(
                &[
                    "dlq",
                    "discard",
                    "--message-id",
                    &discarded,
                    "--reason",
                    "poison",
                ],
                Operator,
                Reader,
                &discarded,
                "dlq discard",
            ),
            case(
                &[
                    "dlq",
                    "replay",
                    "--message-id",
                    &replayed,
                    "--reason",
                    "lock gone",
                    "--verify-within",
                    "30s",
                ],
                Operator,
                Reader,
                &replayed,
                "dlq replay",
            ),
            case(
                &[
                    "dlq",
                    "replay",
                    "--ticket",
                    &bulk,
                    "--reason",
                    "lock gone",
                    "--rate",
                    "20/s",
                    "--canary",
                    "1",
                    "--verify-within",
                    "30s",
                ],
                Operator,
                Reader,
                &in_bulk,
                "dlq replay",
            ),
            Case {
                before: false,
                ..case(
                    &[
                        "activity",
                        "create",
                        "--activity",
                        fresh,
                        "--sku",
                        "1",
                        "--stock",
                        "5",
                    ],
                    Operator,
                    Reader,
                    fresh,
                    "activity create",
                )
            },
            case(
                &[
                    "activity",
                    "create",
                    "--activity",
                    fresh,
                    "--sku",
                    "1",
                    "--stock",
                    "6",
                    "--force",
                    "--reason",
                    "restock before the start",
                ],
                Admin,
                Operator,
                fresh,
                "activity create --force",
            ),
        ];
        let restore = case(
            &[
                "activity",
                "restore",
                "--activity",
                "26",
                "--reason",
                "Redis came back empty",
                "--wait",
                "60s",
            ],
            Admin,
            Operator,
            "26",
            "activity restore",
        );

        for (i, c) in cases.drain(..).chain([restore]).enumerate() {
            if c.command == "activity restore" {
                // What a Redis restarted empty leaves: the engine then
                // refuses reservations until the restore.
                env.lose_redis_state().await?;
            }
            let args: Vec<&str> = c.args.iter().map(String::as_str).collect();
            let rows = env.audit_of(&c.target).await?.len();
            let right = token[&c.right].as_str();
            let mut readonly = args.clone();
            readonly.insert(0, "--readonly");
            for (who, t, argv) in [
                ("no token", None, &args),
                ("a lower role", Some(token[&c.lower].as_str()), &args),
                ("a read-only CLI", Some(right), &readonly),
            ] {
                let out = ctl(&env, &engine, t, argv).await;
                ensure!(
                    out.status.code() == Some(77),
                    "case {i} `{}` with {who}: {out:?}",
                    c.command
                );
                ensure!(
                    env.audit_of(&c.target).await?.len() == rows,
                    "case {i} `{}` with {who} left an audit row",
                    c.command
                );
            }
            let out = ctl(&env, &engine, Some(right), &args).await;
            ensure!(out.status.success(), "case {i} `{}`: {out:?}", c.command);
            let audited = env.audit_of(&c.target).await?;
            let row = audited
                .iter()
                .find(|r| r.command == c.command)
                .ok_or_else(|| {
                    anyhow::anyhow!("case {i}: no `{}` row in {audited:?}", c.command)
                })?;
            ensure!(
                row.actor == format!("cli-{}", c.right) && row.via == "token",
                "case {i}: {row:?}"
            );
            ensure!(row.role == c.right.as_str(), "case {i}: {row:?}");
            ensure!(
                row.after.as_ref().is_some_and(|a| !a.is_null())
                    && row.before.as_ref().is_some_and(|b| !b.is_null()) == c.before,
                "case {i} `{}`: before and after {row:?}",
                c.command
            );
            ensure!(
                row.outcome != "PENDING" && row.outcome != "FAILED",
                "case {i}: {row:?}"
            );
        }
        ensure!(status_of(&env, &to_pay).await? == "PAID");
        ensure!(status_of(&env, &to_cancel).await? == "CANCELED");

        // The rehearsal: refused the same ways, allowed to an operator,
        // and nothing of it is kept.
        let args = [
            "dlq",
            "replay",
            "--message-id",
            &rehearsed,
            "--rehearse",
            "-o",
            "json",
        ];
        for t in [None, Some(token[&Reader].as_str())] {
            let out = ctl(&env, &engine, t, &args).await;
            ensure!(
                out.status.code() == Some(77),
                "rehearse with {t:?}: {out:?}"
            );
        }
        let out = ctl(&env, &engine, Some(&token[&Operator]), &args).await;
        ensure!(out.status.success(), "{out:?}");
        let shown: serde_json::Value = serde_json::from_slice(&out.stdout)?;
        ensure!(shown["verdict"]["verdict"] == "CREATED", "{shown}");
        ensure!(env.audit_of(&rehearsed).await?.is_empty());
        engine.stop().await
    });
}
