//! Backlog governance and observability against the real stack (docs/architecture.md
//! §10–11): lag in seconds under a stopped consumer, the pending view,
//! `/metrics` as Prometheus text, and admission control tripping and
//! recovering in the daemon.

use anyhow::{Result, ensure};
use seckill_engine::{
    ActivityId, Config, Drain, Level, METRIC_NAMES, Observer, Producer, ReserveOutcome,
    RocketProducer, SkuId, Source, TopicKind, publish::order_message, publish::to_outgoing, view,
};
use seckill_tests::{Engine, Setup, TestEnv, eventually, reserve_request, run};
use std::collections::HashSet;
use std::time::Duration;

const ACTIVITY: ActivityId = ActivityId(9);
const SKU: SkuId = SkuId(3);

async fn seed(env: &TestEnv, stock: i64, valid_for_ms: i64) -> Result<()> {
    env.seed_activity(ACTIVITY, SKU, stock, valid_for_ms).await
}

fn engine_cfg(env: &TestEnv) -> Config {
    let mut cfg = env.cfg.clone();
    cfg.governor.interval_ms = 200;
    cfg.governor.recover_after_ticks = 2;
    cfg.scanner.first_retry_after_ms = 500;
    cfg
}

async fn post(engine: &Engine, user: i64) -> Result<(u16, serde_json::Value)> {
    engine.reserve(ACTIVITY, SKU, user).await
}

async fn get_text(engine: &Engine, path: &str) -> Result<String> {
    Ok(engine
        .http
        .get(format!("http://{}{path}", engine.addr))
        .send()
        .await?
        .text()
        .await?)
}

async fn orders(env: &TestEnv) -> Result<i64> {
    Ok(sqlx::query_scalar("SELECT count(*) FROM orders")
        .fetch_one(&env.pool)
        .await?)
}

/// Checks the OpenMetrics text `/metrics` serves, line by line: every
/// sample belongs to a family declared by `# TYPE` (a counter's samples end
/// in `_total`, a histogram's in `_bucket`, `_sum` and `_count`), every
/// value is a number, every label is `name="value"`, and the text ends with
/// `# EOF`. Returns the names of the samples and of their families.
fn parse_openmetrics(text: &str) -> Result<HashSet<String>> {
    let valid_name = |n: &str| {
        !n.is_empty()
            && n.chars().enumerate().all(|(i, c)| {
                c == '_' || c == ':' || c.is_ascii_alphabetic() || (i > 0 && c.is_ascii_digit())
            })
    };
    ensure!(text.ends_with("# EOF\n"), "no # EOF at the end");
    let mut typed: HashSet<String> = HashSet::new();
    let mut sampled = HashSet::new();
    for (no, line) in text.lines().enumerate() {
        let at = || format!("line {}: {line:?}", no + 1);
        if line == "# EOF" {
            continue;
        }
        if let Some(rest) = line.strip_prefix("# ") {
            let mut parts = rest.splitn(3, ' ');
            let (kw, name) = (parts.next(), parts.next());
            ensure!(
                matches!(kw, Some("HELP" | "TYPE" | "UNIT")),
                "unknown comment {}",
                at()
            );
            let name = name.unwrap_or_default();
            ensure!(valid_name(name), "bad family name {}", at());
            if kw == Some("TYPE") {
                let kind = parts.next().unwrap_or_default();
                ensure!(
                    ["counter", "gauge", "histogram", "unknown"].contains(&kind),
                    "bad type {}",
                    at()
                );
                ensure!(typed.insert(name.to_owned()), "family typed twice {}", at());
            }
            continue;
        }
        let (series, value) = line
            .rsplit_once(' ')
            .ok_or_else(|| anyhow::anyhow!("no value {}", at()))?;
        ensure!(
            value.parse::<f64>().is_ok() || ["+Inf", "-Inf", "NaN"].contains(&value),
            "bad value {}",
            at()
        );
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (
                n,
                Some(
                    l.strip_suffix('}')
                        .ok_or_else(|| anyhow::anyhow!("unclosed labels {}", at()))?,
                ),
            ),
            None => (series, None),
        };
        ensure!(valid_name(name), "bad metric name {}", at());
        if let Some(labels) = labels {
            for pair in labels.split("\",").filter(|p| !p.is_empty()) {
                let (k, v) = pair
                    .split_once('=')
                    .ok_or_else(|| anyhow::anyhow!("bad label {}", at()))?;
                ensure!(valid_name(k) && v.starts_with('"'), "bad label {}", at());
            }
        }
        let family = ["_total", "_bucket", "_sum", "_count", "_created"]
            .iter()
            .filter_map(|suffix| name.strip_suffix(suffix))
            .find(|f| typed.contains(*f))
            .unwrap_or(name);
        ensure!(typed.contains(family), "sample before its # TYPE {}", at());
        sampled.insert(family.to_owned());
        sampled.insert(name.to_owned());
    }
    Ok(sampled)
}

/// The value of every sample of `name` whose labels include `with`, summed
/// (labels are matched as `key="value"` pairs, in any order).
fn sum_of(text: &str, name: &str, with: &[(&str, &str)]) -> f64 {
    text.lines()
        .filter_map(|l| {
            let (series, value) = l.rsplit_once(' ')?;
            let (n, labels) = series.split_once('{').unwrap_or((series, "}"));
            (n == name
                && with
                    .iter()
                    .all(|(k, v)| labels.contains(&format!("{k}=\"{v}\""))))
            .then(|| value.parse::<f64>().ok())
            .flatten()
        })
        .sum()
}

async fn count(env: &TestEnv, sql: &str, arg: &str) -> Result<f64> {
    let n: i64 = sqlx::query_scalar(sql)
        .bind(arg)
        .fetch_one(&env.pool)
        .await?;
    Ok(n as f64)
}

async fn count_all(env: &TestEnv, sql: &str) -> Result<f64> {
    let n: i64 = sqlx::query_scalar(sql).fetch_one(&env.pool).await?;
    Ok(n as f64)
}

/// docs/architecture.md §11.1: after a small sale whose every order is
/// canceled unpaid (cancel, compensation and projection traffic on every
/// topic), each family of `/metrics` equals what PostgreSQL holds: sends
/// per topic are the outbox's SENT rows (the order topic's, the order
/// group's inbox), answers per group are its inbox rows, rejections and
/// dead messages match, nothing waits, nothing is in hand, and every seed
/// name has a sample.
#[test]
fn metrics_match_postgres_after_a_small_sale() {
    const ORDERS: i64 = 6;
    run(Setup::Full, |env| async move {
        seckill_engine::activity::create(
            &env.pool,
            &env.store(),
            &seckill_engine::activity::NewActivity {
                activity: ACTIVITY,
                sku: SKU,
                stock: ORDERS,
                valid_for_ms: 300_000,
                pay_within_ms: 2_000,
                force: false,
            },
        )
        .await?;
        let engine = Engine::start(&env, engine_cfg(&env)).await?;
        for user in 1..=ORDERS + 2 {
            let (code, body) = post(&engine, user).await?;
            ensure!(
                code == 202 || (user > ORDERS && code != 500),
                "{user}: {code} {body}"
            );
        }
        let group = |kind| env.names.group(kind);
        let canceled_and_released = || async {
            let canceled = count_all(
                &env,
                "SELECT count(*) FROM orders WHERE status = 'CANCELED'",
            )
            .await?;
            let released = count(
                &env,
                "SELECT count(*) FROM consumer_inbox WHERE consumer_group = $1",
                &group(TopicKind::InventoryCompensate),
            )
            .await?;
            let unsent = count_all(
                &env,
                "SELECT count(*) FROM event_outbox WHERE status <> 'SENT'",
            )
            .await?;
            Ok(
                (canceled == ORDERS as f64 && released == ORDERS as f64 && unsent == 0.0)
                    .then_some(()),
            )
        };
        eventually(
            Duration::from_secs(90),
            "every order canceled, its stock released, the outbox sent",
            canceled_and_released,
        )
        .await?;
        // Then until the projection has read every event and the governor
        // has seen every group drained.
        let outbox_sent = |topic: String| {
            let env = &env;
            async move {
                count(
                    env,
                    "SELECT count(*) FROM event_outbox WHERE topic = $1 AND status = 'SENT'",
                    &topic,
                )
                .await
            }
        };
        let events = outbox_sent(env.names.topic(TopicKind::OrderEvent)).await?;
        let projection = group(TopicKind::OrderEvent);
        let text = eventually(Duration::from_secs(60), "a quiet scrape", || async {
            let t = get_text(&engine, "/metrics").await?;
            let projected = sum_of(&t, "mq_consume_total", &[("group", &projection)]);
            let lagging = sum_of(&t, "mq_consumer_lag_messages", &[]);
            let ticked = t.contains("\nmq_consumer_lag_messages{");
            Ok((ticked && projected == events && lagging == 0.0).then_some(t))
        })
        .await?;
        engine.stop().await?;

        let sampled = parse_openmetrics(&text)?;
        for name in METRIC_NAMES {
            ensure!(sampled.contains(name), "{name} has no sample in:\n{text}");
        }
        shipped_rules_and_dashboard_name_exported_metrics(&text)?;

        // Sends, topic by topic: the engine's confirmed sends are the
        // outbox's SENT rows; the order topic's are the order group's inbox.
        for kind in [
            TopicKind::OrderTimeout,
            TopicKind::OrderEvent,
            TopicKind::InventoryCompensate,
        ] {
            let topic = env.names.topic(kind);
            let sent = sum_of(
                &text,
                "mq_publish_total",
                &[("topic", &topic), ("outcome", "CONFIRMED")],
            );
            ensure!(
                sent == outbox_sent(topic.clone()).await?,
                "{topic}: {sent} sends confirmed, outbox says otherwise:\n{text}"
            );
        }
        let order_topic = env.names.topic(TopicKind::OrderCreate);
        let inbox_of = |kind| {
            let env = &env;
            let g = env.names.group(kind);
            async move {
                count(
                    env,
                    "SELECT count(*) FROM consumer_inbox WHERE consumer_group = $1",
                    &g,
                )
                .await
            }
        };
        let order_inbox = inbox_of(TopicKind::OrderCreate).await?;
        ensure!(order_inbox == ORDERS as f64, "{order_inbox} order messages");
        let sent = sum_of(
            &text,
            "mq_publish_total",
            &[("topic", &order_topic), ("outcome", "CONFIRMED")],
        );
        ensure!(sent == order_inbox, "{sent} order sends:\n{text}");
        ensure!(
            sum_of(&text, "mq_publish_unknown_total", &[]) == 0.0,
            "{text}"
        );

        // Answers, group by group: every delivery was acknowledged once,
        // and each group's inbox holds one row per message.
        for kind in [
            TopicKind::OrderCreate,
            TopicKind::OrderTimeout,
            TopicKind::InventoryCompensate,
        ] {
            let g = env.names.group(kind);
            let acked = sum_of(
                &text,
                "mq_consume_total",
                &[("group", &g), ("result", "ACK")],
            );
            let inbox = inbox_of(kind).await?;
            ensure!(
                acked == inbox,
                "{g}: {acked} acked, {inbox} in its inbox:\n{text}"
            );
        }
        ensure!(
            sum_of(&text, "mq_consume_total", &[("group", &projection)]) == events,
            "{text}"
        );
        for family in ["mq_ack_failure_total", "mq_duplicate_message_total"] {
            ensure!(sum_of(&text, family, &[]) == 0.0, "{family}:\n{text}");
        }
        let order_group = group(TopicKind::OrderCreate);
        let rejected = count(
            &env,
            "SELECT count(*) FROM consumer_inbox WHERE consumer_group = $1 AND status = 'REJECTED'",
            &order_group,
        )
        .await?;
        ensure!(
            sum_of(&text, "mq_business_reject_total", &[]) == rejected,
            "{text}"
        );
        let dead = count_all(&env, "SELECT count(*) FROM dlq_messages").await?;
        ensure!(sum_of(&text, "mq_dlq_messages", &[]) == dead, "{text}");

        // At rest: nothing in hand, nothing waiting for this engine, and
        // the order group's ready figure comes from its real assignment.
        ensure!(sum_of(&text, "mq_consumer_inflight", &[]) == 0.0, "{text}");
        ensure!(
            text.contains(&format!(
                "mq_consumer_ready{{group=\"{order_group}\",topic=\"{order_topic}\"}} 0.0"
            )),
            "{text}"
        );
        ensure!(
            sum_of(&text, "reservation_mq_pending", &[]) == 0.0,
            "{text}"
        );
        // Every order transaction is in the histogram.
        ensure!(
            sum_of(&text, "order_tx_latency_seconds_count", &[]) >= 1.0,
            "{text}"
        );
        ensure!(
            sum_of(&text, "seckill_admission_open", &[]) == 1.0,
            "{text}"
        );
        Ok(())
    });
}

#[test]
fn backlog_and_pending_track_a_stopped_consumer() {
    run(Setup::Full, |env| async move {
        const VALID_FOR_MS: i64 = 60_000;
        seed(&env, 100, VALID_FOR_MS).await?;
        // One order through the engine, so the group has committed offsets;
        // then the consumer stops.
        let engine = Engine::start(&env, engine_cfg(&env)).await?;
        let (code, body) = post(&engine, 1).await?;
        ensure!(code == 202, "{code} {body}");
        eventually(Duration::from_secs(60), "the first order", || async {
            Ok((orders(&env).await? == 1).then_some(()))
        })
        .await?;
        let (topic, group) = (
            env.names.topic(TopicKind::OrderCreate),
            env.names.group(TopicKind::OrderCreate),
        );
        eventually(
            Duration::from_secs(30),
            "zero lag once the order is acked",
            || async { Ok((env.admin.lag(&topic, &group).await?.messages == 0).then_some(())) },
        )
        .await?;
        engine.stop().await?;
        let mut o = Observer::new(&env.cfg, env.rt.clone());

        // A backlog of known size and age: reservations written to Redis and
        // their messages stored on the broker, with nobody consuming.
        let s = env.store();
        let born = chrono::Utc::now().timestamp_millis();
        let mut msgs = Vec::new();
        for user in 100..120 {
            let req = reserve_request(ACTIVITY, SKU, user, born, VALID_FOR_MS);
            let ReserveOutcome::Reserved(r) = s.reserve(&req, born + 600_000).await? else {
                anyhow::bail!("reservation refused");
            };
            msgs.push(to_outgoing(&order_message(&r), &topic));
        }
        let producer = RocketProducer::start(
            env.rt.clone(),
            &env.cfg.namesrv_addr,
            &format!("{}PG_OBSERVE", env.names.prefix()),
            Duration::from_secs(3),
            0,
        )
        .await?;
        let sent = producer.send_batch(msgs, Duration::from_secs(3)).await;
        producer.shutdown().await;
        ensure!(sent.is_confirmed(), "{sent:?}");

        tokio::time::sleep(Duration::from_secs(3)).await; // age the backlog by a known amount
        let first = o.sample().await;
        tokio::time::sleep(Duration::from_millis(500)).await;
        let second = o.sample().await;
        let age = (second.at_ms - born) as f64 / 1000.0;
        o.shutdown().await;

        let rows = view::backlog(Some(&first), &second, &env.names);
        let order = rows
            .iter()
            .find(|r| r.group == env.names.group(TopicKind::OrderCreate))
            .expect("the order group");
        assert_eq!(order.lag_messages, 20, "{order:?}");
        assert!(
            (order.lag_seconds - age).abs() <= 1.0,
            "lag {order:?} vs age {age:.2} s"
        );
        assert_eq!(order.consume_per_s, Some(0.0));
        assert_eq!(order.drain, Some(Drain::Never), "nothing consumes");
        assert_eq!(order.verdict, Level::Critical);
        let left = order
            .seconds_to_oldest_expiry
            .expect("valid_until from the bodies");
        let want = VALID_FOR_MS as f64 / 1000.0 - age;
        assert!((left - want).abs() <= 1.0, "{left} vs {want}");
        assert!(
            second.error(Source::Engine).is_some(),
            "the engine is stopped"
        );
        let server = second.pg.as_ref().expect("the server's activity");
        assert!(server.autovacuum.is_some(), "{server:?}");
        assert!(server.churn_dead_rows >= 0 && server.churn_live_rows >= 0);

        // The same 20 are pending in Redis (no engine marked them sent).
        let pending = view::pending(&second);
        let p = pending
            .iter()
            .find(|p| p.activity_id == ACTIVITY)
            .expect("the activity");
        assert_eq!(p.count, 20);
        let oldest = p.oldest_age_s.expect("an oldest age");
        assert!((oldest - age).abs() <= 1.0, "{oldest} vs {age}");
        assert_eq!(p.attempts.get(&0), Some(&20));

        let alerts = view::alert_inputs(Some(&first), &second);
        let lag = alerts.consumer_lag_s.expect("lag read");
        assert!((lag - age).abs() <= 1.0);
        assert_eq!(alerts.send_unknown, None, "no engine, no send figures");
        Ok(())
    });
}

#[test]
fn admission_control_trips_and_recovers() {
    run(Setup::Full, |env| async move {
        seed(&env, 100, 20_000).await?;
        let engine = Engine::start(&env, engine_cfg(&env)).await?;

        // Hold the hot inventory row: order transactions queue behind it,
        // lag grows, nothing drains, and PostgreSQL has no headroom.
        let mut holder = env.pool.begin().await?;
        sqlx::query("SELECT 1 FROM inventory WHERE activity_id = $1 AND sku_id = $2 FOR UPDATE")
            .bind(ACTIVITY)
            .bind(SKU)
            .execute(&mut *holder)
            .await?;
        for user in 1..=5 {
            let (code, body) = post(&engine, user).await?;
            ensure!(code == 202, "{code} {body}");
        }
        // Every reservation accepted before the gate closes becomes an order later.
        let accepted = std::sync::atomic::AtomicI64::new(5);
        let mut user = 100;
        let refused = eventually(Duration::from_secs(60), "admission control to trip", || {
            user += 1;
            let (u, engine, accepted) = (user, &engine, &accepted);
            async move {
                let (code, body) = post(engine, u).await?;
                if code == 202 {
                    accepted.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
                Ok((code == 503).then_some(body))
            }
        })
        .await?;
        let accepted = accepted.into_inner();
        assert_eq!(refused["error"], "ADMISSION_CLOSED", "{refused}");
        assert_eq!(orders(&env).await?, 0, "nothing got past the lock");

        // Release it: the backlog drains, and after clear ticks the gate opens.
        holder.rollback().await?;
        eventually(Duration::from_secs(60), "the queued orders", || async {
            Ok((orders(&env).await? == accepted).then_some(()))
        })
        .await?;
        let mut user = 1_000;
        eventually(
            Duration::from_secs(60),
            "admission control to recover",
            || {
                user += 1;
                let u = user;
                let engine = &engine;
                async move {
                    let (code, _) = post(engine, u).await?;
                    Ok((code == 202).then_some(()))
                }
            },
        )
        .await?;
        let stats: serde_json::Value =
            serde_json::from_str(&get_text(&engine, "/v1/stats").await?)?;
        let g = &stats["governor"];
        assert_eq!(g["admission_open"], true, "{g}");
        assert!(g["admission_trips"].as_u64() >= Some(1), "{g}");
        assert!(g["admission_recoveries"].as_u64() >= Some(1), "{g}");
        assert!(g["admission_refused"].as_u64() >= Some(1), "{g}");
        assert!(
            g["limit"].as_u64() <= g["budget"].as_u64(),
            "never above the budget: {g}"
        );
        engine.stop().await?;
        Ok(())
    });
}

/// The metric names an expression of the shipped rules or dashboard reads:
/// its identifiers, less PromQL's functions and keywords, label matchers,
/// ranges and `by (…)` / `without (…)` label lists.
fn metric_names_in(expr: &str) -> Vec<String> {
    const PROMQL: [&str; 20] = [
        "sum",
        "max",
        "min",
        "avg",
        "count",
        "rate",
        "irate",
        "increase",
        "delta",
        "abs",
        "histogram_quantile",
        "quantile_over_time",
        "max_over_time",
        "and",
        "or",
        "unless",
        "on",
        "ignoring",
        "bool",
        "offset",
    ];
    // Drop what sits between braces, brackets and quotes.
    let mut plain = String::new();
    let mut closing: Option<char> = None;
    for c in expr.chars() {
        match (closing, c) {
            (Some(end), c) if c == end => closing = None,
            (Some(_), _) => {}
            (None, '{') => closing = Some('}'),
            (None, '[') => closing = Some(']'),
            (None, '"') => closing = Some('"'),
            (None, c) => plain.push(c),
        }
    }
    let mut names = Vec::new();
    let mut skip_list = false;
    let mut word = String::new();
    for c in plain.chars().chain(std::iter::once(' ')) {
        if c.is_ascii_alphanumeric() || c == '_' || c == ':' {
            word.push(c);
            continue;
        }
        if !word.is_empty() {
            let w = std::mem::take(&mut word);
            if w == "by" || w == "without" {
                skip_list = true;
            } else if !skip_list
                && !PROMQL.contains(&w.as_str())
                && !w.starts_with(|c: char| c.is_ascii_digit())
            {
                names.push(w);
            }
        }
        if c == ')' {
            skip_list = false;
        }
    }
    names
}

/// `promtool check rules` accepts the shipped rules: PromQL that parses,
/// durations, labels and annotations where Prometheus wants them.
/// `stack.sh install` unpacks promtool from Debian's prometheus package
/// and `scripts/lib.sh` names it in `SECKILL_PROMTOOL`.
#[test]
fn promtool_accepts_the_shipped_rules() {
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let promtool = std::env::var("SECKILL_PROMTOOL").unwrap_or_else(|_| "promtool".to_owned());
    let out = std::process::Command::new(&promtool)
        .arg("check")
        .arg("rules")
        .arg(root.join("deploy/prometheus/seckill-rules.yml"))
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run {promtool} ({e}): run ./scripts/stack.sh install, which fetches it")
        });
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(out.status.success(), "promtool check rules: {said}");
    assert!(said.contains("SUCCESS"), "{said}");
}

/// docs/architecture.md §11.2: `deploy/prometheus/seckill-rules.yml` and
/// `deploy/grafana/seckill.json` read only metrics `/metrics` exports, and
/// every rule's runbook exists.
fn shipped_rules_and_dashboard_name_exported_metrics(metrics: &str) -> Result<()> {
    let exported: HashSet<&str> = metrics
        .lines()
        .filter_map(|l| match l.strip_prefix("# TYPE ") {
            Some(rest) => rest.split(' ').next(),
            None if !l.starts_with('#') => l.split(['{', ' ']).next(),
            None => None,
        })
        .collect();
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("..");
    let rules = std::fs::read_to_string(root.join("deploy/prometheus/seckill-rules.yml"))?;
    let mut exprs: Vec<String> = rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("expr: "))
        .map(str::to_owned)
        .collect();
    ensure!(exprs.len() >= 16, "{} rule expressions", exprs.len());
    for runbook in rules
        .lines()
        .filter_map(|l| l.trim().strip_prefix("runbook_url: "))
    {
        ensure!(root.join(runbook).is_file(), "no runbook {runbook}");
    }
    let dashboard: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(
        root.join("deploy/grafana/seckill.json"),
    )?)?;
    let panels = dashboard["panels"].as_array().cloned().unwrap_or_default();
    ensure!(panels.len() >= 6, "{} panels", panels.len());
    for p in &panels {
        for t in p["targets"].as_array().into_iter().flatten() {
            exprs.push(t["expr"].as_str().unwrap_or_default().to_owned());
        }
    }
    for expr in &exprs {
        let names = metric_names_in(expr);
        ensure!(!names.is_empty(), "{expr:?} names no metric");
        for name in names {
            ensure!(
                exported.contains(name.as_str()),
                "{expr:?} reads {name}, which /metrics does not export"
            );
        }
    }
    Ok(())
}

#[test]
fn promql_names_are_read_past_functions_labels_and_ranges() {
    assert_eq!(
        metric_names_in(
            r#"sum(rate(mq_publish_total{outcome="UNKNOWN"}[1m])) / sum(rate(mq_publish_total[1m])) > 0.001"#
        ),
        ["mq_publish_total", "mq_publish_total"]
    );
    assert_eq!(
        metric_names_in("max by (group) (mq_consumer_lag_seconds) > 2.5"),
        ["mq_consumer_lag_seconds"]
    );
    assert_eq!(
        metric_names_in("max(no_such_metric) > 1"),
        ["no_such_metric"]
    );
}
