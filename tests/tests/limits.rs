//! The API's limits on a real daemon (docs/architecture.md §13.2,
//! "Limits"): a body past `[http] max_body_bytes` is a 413 and headers
//! past `max_header_bytes` a 431, each a JSON error, and neither writes
//! anything; a body that does not parse is a 400, never taken for none.
//! The in-flight bound and the timeout are unit-tested in
//! `engine/src/daemon/limits.rs` against the same middleware.

use anyhow::{Result, ensure};
use seckill_engine::{ActivityId, RequestId, SkuId};
use seckill_tests::{Engine, Setup, run};

const ACTIVITY: ActivityId = ActivityId(19);
const SKU: SkuId = SkuId(1);

async fn error_of(r: reqwest::Response) -> Result<(u16, String)> {
    let status = r.status().as_u16();
    let body: serde_json::Value = r.json().await?;
    Ok((
        status,
        body["error"].as_str().unwrap_or_default().to_owned(),
    ))
}

#[test]
fn a_huge_body_is_413_huge_headers_431_and_a_bad_pay_body_400() {
    run(Setup::Full, |env| async move {
        env.seed_activity(ACTIVITY, SKU, 10, 300_000).await?;
        let mut cfg = env.cfg.clone();
        cfg.http.max_body_bytes = 4 * 1024;
        cfg.http.max_header_bytes = 8 * 1024;
        let engine = Engine::start(&env, cfg).await?;
        let reserve = format!(
            "http://{}/v1/activities/{}/skus/{}/reservations",
            engine.addr, ACTIVITY.0, SKU.0
        );

        // A well-formed body that is too large: a request id padded past
        // the limit. The daemon stops reading at the limit.
        let padded = serde_json::json!({
            "user_id": 1,
            "request_id": RequestId::generate().as_str(),
            "padding": "x".repeat(64 * 1024),
        });
        let r = engine.http.post(&reserve).json(&padded).send().await?;
        ensure!(error_of(r).await? == (413, "BODY_TOO_LARGE".into()));

        let r = engine
            .http
            .post(&reserve)
            .header("x-junk", "a".repeat(16 * 1024))
            .json(&serde_json::json!({"user_id": 1, "request_id": RequestId::generate().as_str()}))
            .send()
            .await?;
        ensure!(error_of(r).await? == (431, "HEADERS_TOO_LARGE".into()));

        // Nothing was reserved by either.
        let stock = env.store().stock(ACTIVITY, SKU).await?;
        ensure!(stock == Some(10), "stock {stock:?}");

        // A body within the limit is served as before.
        let ok = engine
            .http
            .post(&reserve)
            .json(&serde_json::json!({"user_id": 1, "request_id": RequestId::generate().as_str()}))
            .send()
            .await?;
        ensure!(ok.status() == 202, "{}", ok.status());
        let queued: serde_json::Value = ok.json().await?;
        let order = queued["order_id"].as_str().unwrap_or_default().to_owned();
        env.order_created(&order).await?;

        // A pay body that does not parse is refused, not paid with a
        // generated payment id.
        let pay = format!("http://{}/v1/orders/{order}/pay", engine.addr);
        let r = engine
            .http
            .post(&pay)
            .header("content-type", "application/json")
            .body("{\"payment_id\": ")
            .send()
            .await?;
        ensure!(error_of(r).await? == (400, "BAD_BODY".into()));
        let o = seckill_engine::order::get(&env.pool, &order.parse()?)
            .await?
            .expect("the order");
        ensure!(o.status.to_string() == "CREATED", "{o:?}");
        engine.stop().await
    });
}
