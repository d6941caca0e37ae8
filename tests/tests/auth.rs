//! The token gate on a real daemon (docs/security.md): every API route
//! refuses a missing token with 401 and a role too low with 403, each with
//! a JSON error; the probes and `/metrics` stay open (and move to
//! `--admin-listen`); a revoked token stops working within the refresh;
//! a payment leaves an audit row with the order before and after.

use anyhow::{Result, ensure};
use seckill_engine::{ActivityId, AuthMode, Config, RequestId, Role, SkuId, TokenError, tokens};
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
        env.order_created(&order).await?;
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
        let rows = env.audit_of(&order).await?;
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
        let rows = env.audit_of("ops-1").await?;
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

#[test]
fn the_operator_api_needs_an_operator_and_audits_under_the_token() {
    run(Setup::Full, |env| async move {
        env.seed_activity(ACTIVITY, SKU, 10, 300_000).await?;
        let c = Callers::issue(&env).await?;
        let engine = Engine::start(&env, engine_cfg(&env)).await?;
        let base = format!("http://{}", engine.addr);

        // An order to cancel.
        let queued: serde_json::Value = reserve(c.of(Role::Ingress), &engine, 7)
            .await?
            .json()
            .await?;
        let order = queued["order_id"].as_str().unwrap_or_default().to_owned();
        env.order_created(&order).await?;
        // A ticket to move.
        let ticket = seckill_engine::TicketId::generate();
        sqlx::query(
            "INSERT INTO dlq_tickets (ticket_id, consumer_group, error_class) VALUES ($1, 'CG_X', 'UNKNOWN')",
        )
        .bind(&ticket)
        .execute(&env.pool)
        .await?;

        let cancel = format!("{base}/v1/ops/orders/{order}/cancel");
        let cancel_body = serde_json::json!({"reason": "fraud"});
        let moves = format!("{base}/v1/ops/tickets/{ticket}");
        let ack = serde_json::json!({"action": "ack"});
        let discard = format!("{base}/v1/ops/dlq/discard");
        let discard_body = serde_json::json!({
            "message_id": seckill_engine::MessageId::generate().as_str(),
            "reason": "poison"
        });
        let some_message = seckill_engine::MessageId::generate();
        let replay = format!("{base}/v1/ops/dlq/replay");
        let replay_body = serde_json::json!({
            "message_id": some_message.as_str(), "reason": "fixed", "verify_within_ms": 1000
        });
        let rehearse = format!("{base}/v1/ops/dlq/rehearse");
        let rehearse_body = serde_json::json!({"message_id": some_message.as_str()});
        let bulk = format!("{base}/v1/ops/tickets/{ticket}/replay");
        let bulk_body = serde_json::json!({
            "reason": "fixed", "rate_per_s": 10.0, "canary": 1, "verify_within_ms": 1000
        });
        let create = format!("{base}/v1/ops/activities");
        let create_body = serde_json::json!({
            "activity": 19, "sku": 1, "stock": 5, "valid_for_ms": 300000, "pay_within_ms": 900000
        });
        let restore = format!("{base}/v1/ops/activities/{}/restore", ACTIVITY.0);
        let restore_body = serde_json::json!({"reason": "lost", "wait_ms": 1000});
        let operate = [
            (&cancel, &cancel_body),
            (&moves, &ack),
            (&discard, &discard_body),
            (&replay, &replay_body),
            (&rehearse, &rehearse_body),
            (&bulk, &bulk_body),
            (&create, &create_body),
        ];
        for (url, body) in operate.into_iter().chain([(&restore, &restore_body)]) {
            refused(
                c.none.post(url).json(body).send().await?,
                401,
                "UNAUTHENTICATED",
            )
            .await?;
            for r in [Role::Ingress, Role::Payments, Role::Reader] {
                refused(c.of(r).post(url).json(body).send().await?, 403, "FORBIDDEN").await?;
            }
        }
        // A restore and a forced re-seed are the admin's: the operator is
        // refused both, and nothing is audited.
        let forced = serde_json::json!({
            "activity": ACTIVITY.0, "sku": SKU.0, "stock": 99, "valid_for_ms": 300000,
            "pay_within_ms": 900000, "force": true, "reason": "restock"
        });
        for (url, body) in [(&restore, &restore_body), (&create, &forced)] {
            let r = c.of(Role::Operator).post(url).json(body).send().await?;
            refused(r, 403, "FORBIDDEN").await?;
        }
        ensure!(env.audit_of(&ACTIVITY.to_string()).await?.is_empty());
        // A hostile wait is a 400, before anything is touched.
        let long = serde_json::json!({
            "message_id": some_message.as_str(), "reason": "fixed", "verify_within_ms": u64::MAX
        });
        let r = c
            .of(Role::Operator)
            .post(&replay)
            .json(&long)
            .send()
            .await?;
        refused(r, 400, "BAD_WAIT").await?;
        // Bad input is a 400 before anything is touched.
        let blank = c
            .of(Role::Operator)
            .post(&cancel)
            .json(&serde_json::json!({"reason": " "}))
            .send()
            .await?;
        refused(blank, 400, "NO_REASON").await?;
        // The operator may.
        let ok = c
            .of(Role::Operator)
            .post(&cancel)
            .json(&cancel_body)
            .send()
            .await?;
        ensure!(ok.status() == 200, "{}", ok.status());
        let again = c
            .of(Role::Operator)
            .post(&cancel)
            .json(&cancel_body)
            .send()
            .await?;
        ensure!(again.status() == 409, "a second cancel: {}", again.status());
        let moved = c.of(Role::Operator).post(&moves).json(&ack).send().await?;
        ensure!(moved.status() == 200, "{}", moved.status());
        let t: serde_json::Value = moved.json().await?;
        ensure!(t["status"] == "ACKED", "{t}");
        let unknown = c
            .of(Role::Operator)
            .post(&discard)
            .json(&discard_body)
            .send()
            .await?;
        refused(unknown, 404, "UNKNOWN_MESSAGE").await?;

        // The audit rows name the token, with the state before and after.
        let canceled = env.audit_of(&order).await?;
        let seen: Vec<(&str, &str, &str)> = canceled
            .iter()
            .map(|r| (r.command.as_str(), r.outcome.as_str(), r.actor.as_str()))
            .collect();
        ensure!(
            seen == [
                ("order cancel", "NOOP_ALREADY_CANCELED", "t-operator"),
                ("order cancel", "CANCELED", "t-operator")
            ],
            "{seen:?}"
        );
        let first = &canceled[1];
        ensure!(
            first
                .before
                .as_ref()
                .is_some_and(|b| b["status"] == "CREATED")
        );
        ensure!(
            first
                .after
                .as_ref()
                .is_some_and(|a| a["status"] == "CANCELED")
        );
        ensure!(first.reason.as_deref() == Some("OPERATOR: fraud"));
        let acked = env.audit_of(ticket.as_str()).await?;
        ensure!(
            acked.len() == 1 && acked[0].command == "dlq ticket ack",
            "{acked:?}"
        );
        ensure!(
            acked[0]
                .before
                .as_ref()
                .is_some_and(|b| b["status"] == "OPEN")
        );
        ensure!(acked[0].via == "token" && acked[0].role == "operator");
        engine.stop().await
    });
}
