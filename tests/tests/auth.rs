//! The token gate on a real daemon (docs/security.md): every API route
//! refuses a missing token with 401 and a role too low with 403, each with
//! a JSON error; the probes and `/metrics` stay open (and move to
//! `--admin-listen`); a revoked token stops working within the refresh;
//! a payment leaves an audit row with the order before and after.

use anyhow::{Result, ensure};
use seckill_engine::{
    ActivityId, AuthMode, Config, RequestId, Role, SkuId, TokenError, audit, tokens,
};
use seckill_tests::{Engine, Setup, TestEnv, client_with, eventually, run, test_actor};
use std::time::Duration;

const ACTIVITY: ActivityId = ActivityId(18);
const SKU: SkuId = SkuId(1);

fn engine_cfg(env: &TestEnv) -> Config {
    let mut cfg = env.cfg.clone();
    cfg.auth.refresh_ms = 200;
    cfg
}

/// One client per role, plus one that sends nothing and one whose token
/// nobody issued.
struct Callers {
    none: reqwest::Client,
    bogus: reqwest::Client,
    role: Vec<(Role, reqwest::Client)>,
}

impl Callers {
    async fn issue(env: &TestEnv) -> Result<Callers> {
        let mut role = Vec::new();
        for r in Role::ALL {
            let token = env.issue_token(&format!("t-{r}"), r).await?;
            role.push((r, client_with(&token)));
        }
        Ok(Callers {
            none: reqwest::Client::new(),
            bogus: client_with("skt_0000"),
            role,
        })
    }

    fn of(&self, r: Role) -> &reqwest::Client {
        &self
            .role
            .iter()
            .find(|(x, _)| *x == r)
            .expect("every role")
            .1
    }
}

async fn reserve(http: &reqwest::Client, engine: &Engine, user: i64) -> Result<reqwest::Response> {
    Ok(http
        .post(format!(
            "http://{}/v1/activities/{}/skus/{}/reservations",
            engine.addr, ACTIVITY.0, SKU.0
        ))
        .json(&serde_json::json!({"user_id": user, "request_id": RequestId::generate().as_str()}))
        .send()
        .await?)
}

/// A refusal: the status and the JSON error code.
async fn refused(r: reqwest::Response, status: u16, code: &str) -> Result<()> {
    ensure!(r.status().as_u16() == status, "{} not {status}", r.status());
    let body: serde_json::Value = r.json().await?;
    ensure!(body["error"] == code, "{body}");
    ensure!(!body["reason"].as_str().unwrap_or_default().is_empty());
    Ok(())
}

#[test]
fn every_route_needs_its_role_and_the_probes_stay_open() {
    run(Setup::Full, |env| async move {
        env.seed_activity(ACTIVITY, SKU, 10, 300_000).await?;
        // Issued before the daemon starts, so its first read has them.
        let c = Callers::issue(&env).await?;
        let engine = Engine::start(&env, engine_cfg(&env)).await?;
        let base = format!("http://{}", engine.addr);

        // Reserve: ingress (and admin); nobody else.
        refused(reserve(&c.none, &engine, 1).await?, 401, "UNAUTHENTICATED").await?;
        refused(reserve(&c.bogus, &engine, 1).await?, 401, "UNAUTHENTICATED").await?;
        for r in [Role::Payments, Role::Reader, Role::Operator] {
            refused(reserve(c.of(r), &engine, 1).await?, 403, "FORBIDDEN").await?;
        }
        let ok = reserve(c.of(Role::Ingress), &engine, 1).await?;
        ensure!(ok.status().as_u16() == 202, "{}", ok.status());
        let queued: serde_json::Value = ok.json().await?;
        let rsv = queued["reservation_id"]
            .as_str()
            .unwrap_or_default()
            .to_owned();
        let order = queued["order_id"].as_str().unwrap_or_default().to_owned();

        // Status: every role but none.
        let status = format!("{base}/v1/reservations/{rsv}");
        refused(c.none.get(&status).send().await?, 401, "UNAUTHENTICATED").await?;
        for (r, http) in &c.role {
            let got = http.get(&status).send().await?.status().as_u16();
            ensure!(got == 200, "{r} reading a status got {got}");
        }

        // Stats: reader, operator, admin.
        let stats = format!("{base}/v1/stats");
        refused(c.none.get(&stats).send().await?, 401, "UNAUTHENTICATED").await?;
        refused(
            c.of(Role::Ingress).get(&stats).send().await?,
            403,
            "FORBIDDEN",
        )
        .await?;
        refused(
            c.of(Role::Payments).get(&stats).send().await?,
            403,
            "FORBIDDEN",
        )
        .await?;
        ensure!(c.of(Role::Reader).get(&stats).send().await?.status() == 200);

        // Pay: payments (and admin). The operator may not mark money paid.
        eventually(Duration::from_secs(30), "the order exists", || async {
            Ok(seckill_engine::order::get(&env.pool, &order.parse()?)
                .await?
                .map(|_| ()))
        })
        .await?;
        let pay = format!("{base}/v1/orders/{order}/pay");
        refused(c.none.post(&pay).send().await?, 401, "UNAUTHENTICATED").await?;
        for r in [Role::Ingress, Role::Reader, Role::Operator] {
            refused(c.of(r).post(&pay).send().await?, 403, "FORBIDDEN").await?;
        }
        let paid = c
            .of(Role::Payments)
            .post(&pay)
            .json(&serde_json::json!({"payment_id": "pay_gate_1"}))
            .send()
            .await?;
        ensure!(paid.status() == 200, "{}", paid.status());

        // The audit row: who, what, the order before and after.
        let rows = audit::list(
            &env.pool,
            &audit::Filter {
                target: Some(order.clone()),
                limit: 10,
                ..Default::default()
            },
        )
        .await?;
        ensure!(rows.len() == 1, "{rows:?}");
        let row = &rows[0];
        ensure!(row.actor == "t-payments" && row.role == "payments" && row.via == "token");
        ensure!(
            row.command == "order pay" && row.outcome == "PAID",
            "{row:?}"
        );
        let before = row.before.as_ref().expect("before");
        let after = row.after.as_ref().expect("after");
        ensure!(
            before["status"] == "CREATED" && after["status"] == "PAID",
            "{row:?}"
        );
        ensure!(after["payment_id"] == "pay_gate_1");

        // The probes and /metrics need nothing.
        for path in ["/healthz", "/readyz", "/metrics"] {
            let got = c.none.get(format!("{base}{path}")).send().await?.status();
            ensure!(got == 200, "{path} answered {got}");
        }
        engine.stop().await
    });
}

#[test]
fn a_revoked_token_stops_working_within_the_refresh_and_names_are_unique() {
    run(Setup::Full, |env| async move {
        let engine = Engine::start(&env, engine_cfg(&env)).await?;
        let secret = env.issue_token("ops-1", Role::Reader).await?;
        let http = client_with(&secret);
        let stats = format!("http://{}/v1/stats", engine.addr);
        // A token issued after the daemon started works on its first call:
        // an unknown token makes the gate re-read the tokens at once.
        let first = http.get(&stats).send().await?.status();
        ensure!(first == 200, "a new token's first call answered {first}");
        // Its secret is nowhere in the table.
        let stored: Vec<(String,)> = sqlx::query_as("SELECT token_sha256 FROM api_tokens")
            .fetch_all(&env.pool)
            .await?;
        ensure!(
            stored
                .iter()
                .all(|(d,)| !secret.contains(d.as_str()) && !d.contains(&secret))
        );
        ensure!(matches!(
            tokens::create(&env.pool, "ops-1", Role::Admin, &test_actor()).await,
            Err(TokenError::Exists(_))
        ));

        tokens::revoke(&env.pool, "ops-1", &test_actor(), Some("rotated")).await?;
        eventually(
            Duration::from_secs(5),
            "the revoked token is refused",
            || async { Ok((http.get(&stats).send().await?.status() == 401).then_some(())) },
        )
        .await?;
        ensure!(matches!(
            tokens::revoke(&env.pool, "ops-1", &test_actor(), None).await,
            Err(TokenError::AlreadyRevoked(_))
        ));
        // Both changes are in the audit log.
        let rows = audit::list(
            &env.pool,
            &audit::Filter {
                target: Some("ops-1".into()),
                limit: 10,
                ..Default::default()
            },
        )
        .await?;
        let commands: Vec<&str> = rows.iter().map(|r| r.command.as_str()).collect();
        ensure!(
            commands == ["auth token revoke", "auth token create"],
            "{commands:?}"
        );
        ensure!(rows[0].reason.as_deref() == Some("rotated"));
        engine.stop().await
    });
}

#[test]
fn a_new_token_works_at_once_admin_listen_moves_the_probes_and_open_mode_asks_nobody() {
    run(Setup::Full, |env| async move {
        // No periodic refresh in this test's time: a new token can only
        // work through the gate's re-read of an unknown token.
        let mut slow = engine_cfg(&env);
        slow.auth.refresh_ms = 600_000;
        let engine = Engine::start_on(&env, slow, true).await?;
        let admin = engine.admin_addr.expect("an admin address");
        let none = reqwest::Client::new();
        let fresh = client_with(&env.issue_token("fresh", Role::Reader).await?);
        let first = fresh
            .get(format!("http://{}/v1/stats", engine.addr))
            .send()
            .await?
            .status();
        ensure!(first == 200, "a token issued after start answered {first}");
        for path in ["/healthz", "/readyz", "/metrics"] {
            let there = none
                .get(format!("http://{admin}{path}"))
                .send()
                .await?
                .status();
            ensure!(there == 200, "{path} on the admin address: {there}");
            let api = engine
                .http
                .get(format!("http://{}{path}", engine.addr))
                .send()
                .await?;
            ensure!(
                api.status() == 404,
                "{path} on the API address: {}",
                api.status()
            );
        }
        engine.stop().await?;

        let mut cfg = engine_cfg(&env);
        cfg.auth.mode = AuthMode::Open;
        let open = Engine::start(&env, cfg).await?;
        let got = none
            .get(format!("http://{}/v1/stats", open.addr))
            .send()
            .await?
            .status();
        ensure!(got == 200, "open mode answered {got}");
        open.stop().await
    });
}
