//! The binary's contract with scripts: exit codes, JSON output, no secrets.

use std::process::{Command, Output};
use std::time::{Duration, Instant};

fn seckillctl(args: &[&str]) -> (Output, Duration) {
    let started = Instant::now();
    let out = Command::new(env!("CARGO_BIN_EXE_seckillctl"))
        .args(args)
        .env_remove("SECKILL_DATABASE_URL")
        .env_remove("SECKILL_CONFIG")
        .output()
        .expect("run seckillctl");
    (out, started.elapsed())
}

#[test]
fn an_unreachable_database_exits_3_and_names_the_fix() {
    let (out, _) = seckillctl(&[
        "--database-url",
        "postgres://postgres@127.0.0.1:1/x",
        "db",
        "status",
    ]);
    assert_eq!(out.status.code(), Some(3));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("stack.sh up"), "{err}");
}

#[test]
fn a_bad_flag_value_exits_64() {
    let (out, _) = seckillctl(&["--topic-prefix", "bad prefix!", "config"]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("topic prefix"));
}

#[test]
fn config_never_prints_the_password() {
    let (out, _) = seckillctl(&[
        "--database-url",
        "postgres://app:hunter2@127.0.0.1/seckill",
        "config",
        "--output",
        "json",
    ]);
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("hunter2"), "{text}");
    let json: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    assert_eq!(json["database_url"], "postgres://app:***@127.0.0.1/seckill");
}

#[test]
fn config_never_prints_the_token() {
    let out = Command::new(env!("CARGO_BIN_EXE_seckillctl"))
        .args(["config", "--output", "json"])
        .env_remove("SECKILL_CONFIG")
        .env("SECKILL_TOKEN", "skt_do_not_print_me")
        .output()
        .expect("run seckillctl");
    assert!(out.status.success());
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(!text.contains("do_not_print_me"), "{text}");
    let json: serde_json::Value = serde_json::from_str(&text).expect("valid JSON");
    assert_eq!(json["auth"]["token"], "[set]");
    assert_eq!(json["auth"]["mode"], "token");
}

#[test]
fn a_readonly_cli_refuses_a_mutation_with_exit_77_before_connecting() {
    // No database behind this URL: the refusal comes first.
    let (out, _) = seckillctl(&[
        "--readonly",
        "--database-url",
        "postgres://postgres@127.0.0.1:1/none",
        "order",
        "cancel",
        "--order-id",
        "ord_01JCZ9V2Q0AAAAAAAAAAAAAAAA",
        "--reason",
        "test",
    ]);
    assert_eq!(out.status.code(), Some(77), "{out:?}");
    assert!(String::from_utf8_lossy(&out.stderr).contains("read-only"));
    // The bootstrap paths and the bench too, equally before connecting
    // (the operator mutations are driven against a real engine in
    // tests/security.rs).
    for argv in [
        &["db", "migrate"][..],
        &["mq", "setup"],
        &["auth", "token", "create", "--name", "x", "--role", "reader"],
        &["auth", "token", "revoke", "--name", "x"],
        &[
            "bench",
            "flash-sale",
            "--activity",
            "1",
            "--sku",
            "1",
            "--stock",
            "1",
            "--users",
            "1",
            "--rate",
            "1",
        ],
    ] {
        let mut args = vec![
            "--readonly",
            "--database-url",
            "postgres://postgres@127.0.0.1:1/none",
            "--namesrv-addr",
            "127.0.0.1:1",
        ];
        args.extend_from_slice(argv);
        let (out, _) = seckillctl(&args);
        assert_eq!(out.status.code(), Some(77), "{argv:?}: {out:?}");
    }
}

#[test]
fn health_reports_a_dead_nameserver_quickly_with_exit_3() {
    let (out, took) = seckillctl(&[
        "--namesrv-addr",
        "127.0.0.1:1",
        "health",
        "--output",
        "json",
    ]);
    assert_eq!(out.status.code(), Some(3));
    assert!(took < Duration::from_secs(5), "took {took:?}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    let ns = json["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["component"] == "rocketmq-namesrv")
        .expect("namesrv row");
    assert_eq!(ns["state"], "DOWN");
    assert!(ns["detail"].as_str().is_some_and(|d| !d.is_empty()));
}

#[test]
fn health_lists_every_seed_alert_with_a_runbook_that_exists_and_a_missing_engine_exits_3() {
    let (out, _) = seckillctl(&[
        "--engine-url",
        "http://127.0.0.1:1",
        "health",
        "--window",
        "200ms",
        "--output",
        "json",
    ]);
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).expect("valid JSON");
    assert_eq!(out.status.code(), Some(3), "{json}");
    assert_eq!(json["worst"], "UNREACHABLE");
    let engine = json["components"]
        .as_array()
        .unwrap()
        .iter()
        .find(|c| c["component"] == "engine")
        .expect("engine row");
    assert_eq!(engine["state"], "DOWN");
    let alerts = json["alerts"].as_array().unwrap();
    assert_eq!(alerts.len(), 9, "every docs/architecture.md §11.2 alert");
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    for a in alerts {
        let runbook = a["runbook"].as_str().unwrap();
        assert!(root.join(runbook).is_file(), "{runbook} is missing");
    }
    // Engine-side alerts have no data without an engine, and say so.
    let tx = alerts
        .iter()
        .find(|a| a["metric"] == "order_tx_latency_seconds_p99")
        .unwrap();
    assert_eq!(tx["state"], "NO_DATA");
}

#[test]
fn a_malformed_order_id_exits_64_and_names_the_format() {
    let (out, _) = seckillctl(&["order", "pay", "--order-id", "12345"]);
    assert_eq!(out.status.code(), Some(64));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("ord_<ULID>"), "{err}");
}

#[test]
fn an_operator_cancel_needs_a_reason() {
    let (out, _) = seckillctl(&[
        "order",
        "cancel",
        "--order-id",
        "ord_01KBCDW5G2ZJ3T4X8E5N3Y7Q1M",
    ]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--reason"));
}

#[test]
fn a_replay_without_a_reason_is_refused_before_anything_is_touched() {
    let (out, _) = seckillctl(&[
        "dlq",
        "replay",
        "--message-id",
        "evt_01KBCDW5G2ZJ3T4X8E5N3Y7Q1M",
    ]);
    assert_eq!(out.status.code(), Some(64));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--reason"));
    let (out, _) = seckillctl(&[
        "dlq",
        "replay",
        "--message-id",
        "evt_1",
        "--reason",
        "x",
        "--force",
        "everything",
    ]);
    assert_eq!(out.status.code(), Some(64));
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("one of"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}
