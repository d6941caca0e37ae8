//! The daemon's spans over OTLP (docs/architecture.md §11.5): with
//! `SECKILL_OTLP_ENDPOINT` set, `seckillctl engine run` posts its stage
//! spans to a collector, each batch span linked to the span of every
//! message it carried, so one reservation's trace id leads to the batch
//! that published it, the one that made its order and the one that
//! settled its event. The collector here is a real HTTP server on
//! loopback that decodes what it is sent, as a collector would.
#![cfg(feature = "otlp")]

use anyhow::{Context, ensure};
use axum::body::Bytes;
use opentelemetry_proto::tonic::collector::trace::v1::ExportTraceServiceRequest;
use prost::Message;
use seckill_engine::{ActivityId, Role, SkuId};
use seckill_tests::{Setup, TestEnv, eventually, run};
use std::collections::{BTreeMap, BTreeSet};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// What the collector was sent: every span's name and the trace ids of
/// its links, and every resource's `service.name`.
#[derive(Default)]
struct Received {
    spans: Vec<(String, Vec<String>)>,
    services: BTreeSet<String>,
    posts: usize,
    /// Bodies that were not an OTLP request, with why.
    refused: Vec<String>,
}

impl Received {
    /// Stage name → the trace ids its spans are linked to.
    fn linked(&self) -> BTreeMap<&str, BTreeSet<&str>> {
        let mut by_stage: BTreeMap<&str, BTreeSet<&str>> = BTreeMap::new();
        for (name, links) in &self.spans {
            by_stage
                .entry(name)
                .or_default()
                .extend(links.iter().map(String::as_str));
        }
        by_stage
    }
}

fn hex(bytes: &[u8]) -> String {
    bytes.iter().map(|b| format!("{b:02x}")).collect()
}

/// A collector on an ephemeral loopback port: `POST /v1/traces` with an
/// OTLP protobuf body, answered 200 once decoded, 400 otherwise.
async fn collector() -> anyhow::Result<(String, Arc<Mutex<Received>>)> {
    let got = Arc::new(Mutex::new(Received::default()));
    let sink = got.clone();
    let app = axum::Router::new().route(
        "/v1/traces",
        axum::routing::post(move |body: Bytes| {
            let sink = sink.clone();
            async move {
                let mut got = sink.lock().expect("collector lock");
                let req = match ExportTraceServiceRequest::decode(body) {
                    Ok(req) => req,
                    Err(e) => {
                        got.refused.push(e.to_string());
                        return axum::http::StatusCode::BAD_REQUEST;
                    }
                };
                got.posts += 1;
                for rs in req.resource_spans {
                    for kv in rs.resource.iter().flat_map(|r| &r.attributes) {
                        if kv.key == "service.name" {
                            got.services.insert(format!("{:?}", kv.value));
                        }
                    }
                    for span in rs.scope_spans.into_iter().flat_map(|s| s.spans) {
                        let links = span.links.iter().map(|l| hex(&l.trace_id)).collect();
                        got.spans.push((span.name, links));
                    }
                }
                axum::http::StatusCode::OK
            }
        }),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await?;
    let addr = listener.local_addr()?;
    tokio::spawn(async move { axum::serve(listener, app).await });
    Ok((format!("http://{addr}"), got))
}

/// The daemon with its spans going to `endpoint`, logging JSON with the
/// engine at DEBUG into a file (no pipe to keep drained), and its address
/// once it serves.
async fn spawn(
    env: &TestEnv,
    endpoint: &str,
    log: &std::path::Path,
) -> anyhow::Result<(tokio::process::Child, String, std::path::PathBuf)> {
    let conf = std::env::temp_dir().join(format!("seckill-otlp-{}.toml", env.token));
    let daemon = env
        .seckillctl(env!("CARGO_BIN_EXE_seckillctl"), &conf)?
        .args([
            "--log",
            "seckill_engine=debug,warn",
            "--log-format",
            "json",
            "engine",
            "run",
            "--listen",
            "127.0.0.1:0",
        ])
        .env("SECKILL_OTLP_ENDPOINT", endpoint)
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(log)?)
        .kill_on_drop(true)
        .spawn()?;
    let addr = eventually(
        Duration::from_secs(60),
        "`engine serving` in the log",
        || async {
            Ok(logged(log)?
                .into_iter()
                .find(|e| e["message"] == "engine serving")
                .and_then(|e| e["addr"].as_str().map(str::to_owned)))
        },
    )
    .await?;
    Ok((daemon, addr, conf))
}

/// The log's lines so far, each a JSON object.
fn logged(log: &std::path::Path) -> anyhow::Result<Vec<serde_json::Value>> {
    let text = std::fs::read_to_string(log)?;
    text.lines()
        .filter(|l| l.ends_with('}'))
        .map(|l| serde_json::from_str(l).with_context(|| format!("not JSON: {l}")))
        .collect()
}

#[test]
fn stage_spans_reach_the_collector_linked_to_each_reservations_trace() {
    run(Setup::Full, |env| async move {
        env.seed_activity(ActivityId(5), SkuId(1), 10, 300_000)
            .await?;
        let token = env.issue_token("edge", Role::Ingress).await?;
        let (endpoint, got) = collector().await?;
        let log = std::env::temp_dir().join(format!("seckill-otlp-{}.log", env.token));
        let (mut daemon, addr, conf) = spawn(&env, &endpoint, &log).await?;

        // Three reservations, each arriving with its own trace.
        let traces: Vec<String> = (1..=3u8)
            .map(|i| format!("4bf92f3577b34da6a3ce929d0e0e47{i:02x}"))
            .collect();
        for (user, trace) in traces.iter().enumerate() {
            let r = reqwest::Client::new()
                .post(format!("http://{addr}/v1/activities/5/skus/1/reservations"))
                .bearer_auth(&token)
                .header("traceparent", format!("00-{trace}-00f067aa0ba902b7-01"))
                .json(&serde_json::json!({
                    "user_id": 100 + user,
                    "request_id": seckill_engine::RequestId::generate().as_str(),
                }))
                .send()
                .await?;
            ensure!(r.status().as_u16() == 202, "reserve: {}", r.status());
        }

        // The batch processor posts every few seconds; wait until each
        // trace is linked from a span of each stage it went through.
        let stages = ["publish", "consume", "lifecycle"];
        let seen = eventually(
            Duration::from_secs(90),
            "linked spans of every stage",
            || {
                let got = got.clone();
                let traces = traces.clone();
                async move {
                    let got = got.lock().expect("collector lock");
                    let linked = got.linked();
                    let all = stages.iter().all(|s| {
                        linked
                            .get(s)
                            .is_some_and(|t| traces.iter().all(|x| t.contains(x.as_str())))
                    });
                    Ok(all.then(|| format!("{linked:?}")))
                }
            },
        )
        .await;
        // SIGTERM: the daemon drains, and its exporter flushes on the way out.
        let pid = daemon.id().context("the daemon's pid")? as i32;
        // SAFETY: a plain kill(2) of the child this test started.
        unsafe { libc::kill(pid, libc::SIGTERM) };
        let status = tokio::time::timeout(Duration::from_secs(30), daemon.wait())
            .await
            .context("the daemon did not exit within 30 s of SIGTERM")??;
        let _ = std::fs::remove_file(&conf);
        let received = {
            let got = got.lock().expect("collector lock");
            format!(
                "{} posts, {} refused {:?}; services {:?}; links by stage {:?}",
                got.posts,
                got.refused.len(),
                got.refused,
                got.services,
                got.linked()
            )
        };
        seen.with_context(|| format!("the collector got: {received}"))?;
        ensure!(status.success(), "the daemon exited {status}");
        // The log, with its own filter, keeps what it is meant to beside
        // the exporter: each reservation's DEBUG ingress line.
        let ingress: BTreeSet<String> = logged(&log)?
            .into_iter()
            .filter(|e| e["stage"] == "ingress")
            .filter_map(|e| e["trace_id"].as_str().map(str::to_owned))
            .collect();
        let _ = std::fs::remove_file(&log);
        ensure!(
            traces.iter().all(|t| ingress.contains(t)),
            "the log's ingress lines, beside the exporter: {ingress:?}"
        );
        let got = got.lock().expect("collector lock");
        ensure!(
            got.services.iter().any(|s| s.contains("seckill-engine")),
            "the resource names the service: {:?}",
            got.services
        );
        Ok(())
    });
}

#[test]
fn a_daemon_refuses_an_endpoint_that_is_not_a_url() {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_seckillctl"))
        .args(["engine", "run", "--listen", "127.0.0.1:0"])
        .env_remove("SECKILL_CONFIG")
        .env("SECKILL_OTLP_ENDPOINT", "127.0.0.1:4318")
        .output()
        .expect("run seckillctl");
    assert_eq!(out.status.code(), Some(64), "{out:?}");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(stderr.contains("otlp_endpoint"), "{stderr}");
    assert!(
        stderr.contains("http://127.0.0.1:4318"),
        "names the fix: {stderr}"
    );
}
