//! Which engine daemons the console reads, and what each said
//! (docs/architecture.md §14.3). Given `--engine-url A,B`, exactly those;
//! otherwise every live daemon of the registry, and the configured
//! `engine_url` only while the registry names none (an engine of another
//! database, or none at all). Daemons the registry holds as dead are not
//! asked: they are findings of the sample, never errors.
//!
//! [`plan`] is the pure choice; [`read`] asks each target's `/v1/stats`
//! at once, each bounded by the HTTP client's timeout.

use crate::decide::liveness::{DeadBecause, EngineState};
use crate::domain::singleton::Singleton;
use crate::domain::stats::StatsView;
use crate::ops::engines::EngineView;
use serde::{Deserialize, Serialize};

/// How a sample found one daemon.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Seen {
    /// It answered `/v1/stats`.
    Answered,
    /// Live in the registry (or named by `--engine-url`), but it did not
    /// answer: [`EngineSample::error`] says how.
    Unreachable,
    /// The registry says it stopped cleanly (a restart, a scale-in).
    Stopped,
    /// The registry heard nothing from it for `[registry] dead_after_ms`.
    Silent,
}

/// One daemon, as one sample saw it.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct EngineSample {
    /// Its registry id, when the registry knows it.
    pub id: Option<String>,
    pub url: String,
    pub version: Option<String>,
    pub seen: Seen,
    /// The singletons it holds (§14.4).
    #[serde(default)]
    pub roles: Vec<Singleton>,
    /// Since its last heartbeat, on the database's clock.
    pub heartbeat_age_ms: Option<i64>,
    pub stats: Option<StatsView>,
    pub error: Option<String>,
}

/// A daemon to ask.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    pub id: Option<String>,
    pub url: String,
    pub version: Option<String>,
    pub roles: Vec<Singleton>,
    pub heartbeat_age_ms: Option<i64>,
}

/// What a sample asks, and the dead it only reports.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Plan {
    pub ask: Vec<Target>,
    pub dead: Vec<Target>,
    /// Of `dead`, why each is.
    pub dead_because: Vec<Seen>,
}

/// The URL a registry row is reached at: its API address, or its host's
/// name when it listens on every interface (`0.0.0.0:8080` names no host).
pub fn url_of(view: &EngineView) -> String {
    let address = match view.address.rsplit_once(':') {
        Some(("0.0.0.0" | "[::]" | "::", port)) => format!("{}:{port}", view.hostname),
        _ => view.address.clone(),
    };
    format!("http://{address}")
}

fn target(view: &EngineView) -> Target {
    Target {
        id: Some(view.id.clone()),
        url: url_of(view),
        version: Some(view.version.clone()),
        roles: view.roles.clone(),
        heartbeat_age_ms: Some(view.heartbeat_age_ms),
    }
}

/// Chooses whom a sample asks. `explicit` is `--engine-url`'s list,
/// `registry` the registry's recent rows (`None` when unreadable) and
/// `fallback` the configured `engine_url`.
pub fn plan(explicit: &[String], registry: Option<&[EngineView]>, fallback: &str) -> Plan {
    let rows = registry.unwrap_or_default();
    let live: Vec<Target> = rows
        .iter()
        .filter(|e| e.state == EngineState::Live)
        .map(target)
        .collect();
    let (dead, dead_because): (Vec<Target>, Vec<Seen>) = rows
        .iter()
        .filter(|e| e.state == EngineState::Dead)
        // Only the dead of no configured URL: a daemon restarted on the
        // same address is the live one.
        .filter(|e| !explicit.contains(&url_of(e)) && !live.iter().any(|t| t.url == url_of(e)))
        .map(|e| {
            let why = match e.dead_because {
                Some(DeadBecause::Stopped) => Seen::Stopped,
                _ => Seen::Silent,
            };
            (target(e), why)
        })
        .unzip();
    let ask = if !explicit.is_empty() {
        explicit
            .iter()
            .map(|url| {
                live.iter()
                    .find(|t| &t.url == url)
                    .cloned()
                    .unwrap_or_else(|| Target {
                        id: None,
                        url: url.clone(),
                        version: None,
                        roles: Vec::new(),
                        heartbeat_age_ms: None,
                    })
            })
            .collect()
    } else if !live.is_empty() {
        live
    } else {
        vec![Target {
            id: None,
            url: fallback.to_owned(),
            version: None,
            roles: Vec::new(),
            heartbeat_age_ms: None,
        }]
    };
    Plan {
        ask,
        dead,
        dead_because,
    }
}

/// Where an operator's mutation goes (docs/architecture.md §14.3), in the
/// order to try: `--engine-url`'s list when given; else the live daemons of
/// the registry, newest started first; else the configured `engine_url`.
/// Any daemon serves the operator API, since they share the stores.
pub async fn operator_urls(cfg: &crate::config::Config) -> Vec<String> {
    if !cfg.engine_urls.is_empty() {
        return cfg.engine_urls.clone();
    }
    let read = async {
        let pool = crate::store::db::connect_unchecked(cfg).await.ok()?;
        let window = chrono::Duration::milliseconds(
            i64::try_from(cfg.registry.dead_after_ms).unwrap_or(i64::MAX),
        );
        let rows = crate::ops::engines::list(&pool, &cfg.registry, window)
            .await
            .ok();
        pool.close().await;
        rows
    };
    let rows = tokio::time::timeout(cfg.admin_timeout(), read)
        .await
        .ok()
        .flatten();
    plan(&[], rows.as_deref(), &cfg.engine_url)
        .ask
        .into_iter()
        .map(|t| t.url)
        .collect()
}

/// Asks every target of `plan` at once; the dead come after, unasked.
pub async fn read(http: &reqwest::Client, plan: Plan) -> Vec<EngineSample> {
    let answered = each(plan.ask, |t| {
        let http = http.clone();
        async move {
            let got = stats(&http, &t.url).await;
            (t, got)
        }
    })
    .await;
    let mut out: Vec<EngineSample> = answered
        .into_iter()
        .map(|(t, got)| {
            let (seen, stats, error) = match got {
                Ok(s) => (Seen::Answered, Some(s), None),
                Err(e) => (Seen::Unreachable, None, Some(e)),
            };
            sample(t, seen, stats, error)
        })
        .collect();
    out.extend(
        plan.dead
            .into_iter()
            .zip(plan.dead_because)
            .map(|(t, why)| sample(t, why, None, None)),
    );
    out
}

/// `ask` for every target at once, the answers in the targets' order.
pub(crate) async fn each<Out, Fut>(targets: Vec<Target>, ask: impl Fn(Target) -> Fut) -> Vec<Out>
where
    Out: Send + 'static,
    Fut: std::future::Future<Output = Out> + Send + 'static,
{
    let mut asks = tokio::task::JoinSet::new();
    for (i, t) in targets.into_iter().enumerate() {
        let fut = ask(t);
        asks.spawn(async move { (i, fut.await) });
    }
    let mut out = Vec::new();
    while let Some(joined) = asks.join_next().await {
        if let Ok(one) = joined {
            out.push(one);
        }
    }
    out.sort_by_key(|(i, _)| *i);
    out.into_iter().map(|(_, o)| o).collect()
}

fn sample(t: Target, seen: Seen, stats: Option<StatsView>, error: Option<String>) -> EngineSample {
    EngineSample {
        id: t.id,
        url: t.url,
        version: t.version,
        seen,
        roles: t.roles,
        heartbeat_age_ms: t.heartbeat_age_ms,
        stats,
        error,
    }
}

/// One daemon's `/v1/stats`, or why not, in words with the fix.
async fn stats(http: &reqwest::Client, url: &str) -> Result<StatsView, String> {
    let resp = http.get(format!("{url}/v1/stats")).send().await.map_err(|e| {
        format!(
            "no engine answers at {url} ({e}); start one with `seckillctl engine run` or point --engine-url at it"
        )
    })?;
    match resp.status() {
        s if s.is_success() => resp.json::<StatsView>().await.map_err(|e| {
            format!(
                "{url}/v1/stats: unreadable answer ({e}); is it a seckill engine of this version?"
            )
        }),
        s @ (reqwest::StatusCode::UNAUTHORIZED | reqwest::StatusCode::FORBIDDEN) => Err(format!(
            "{url}/v1/stats answered {s}: set SECKILL_TOKEN (or [auth] token_file) to a reader token (`seckillctl auth token create --role reader`)"
        )),
        s => Err(format!("{url}/v1/stats answered {s}")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::Utc;

    fn row(id: &str, address: &str, state: EngineState, why: Option<DeadBecause>) -> EngineView {
        EngineView {
            id: id.into(),
            address: address.into(),
            version: "0.1.0".into(),
            state,
            dead_because: why,
            roles: Vec::new(),
            hostname: "box".into(),
            pid: 1,
            started_at: Utc::now(),
            heartbeat_at: Utc::now(),
            heartbeat_age_ms: 100,
            stopped_at: None,
        }
    }

    #[test]
    fn the_registry_decides_unless_urls_are_given() {
        let rows = [
            row("a", "127.0.0.1:8080", EngineState::Live, None),
            row("b", "0.0.0.0:8081", EngineState::Live, None),
            row(
                "c",
                "127.0.0.1:8082",
                EngineState::Dead,
                Some(DeadBecause::Silent),
            ),
            row(
                "d",
                "127.0.0.1:8083",
                EngineState::Dead,
                Some(DeadBecause::Stopped),
            ),
        ];
        let p = plan(&[], Some(&rows), "http://fallback:1");
        let urls: Vec<&str> = p.ask.iter().map(|t| t.url.as_str()).collect();
        assert_eq!(urls, ["http://127.0.0.1:8080", "http://box:8081"]);
        assert_eq!(p.ask[0].id.as_deref(), Some("a"));
        assert_eq!(p.dead.len(), 2);
        assert_eq!(p.dead_because, [Seen::Silent, Seen::Stopped]);

        // A list names exactly whom to ask; the registry still labels them.
        let given = ["http://127.0.0.1:8080".to_owned(), "http://x:9".to_owned()];
        let p = plan(&given, Some(&rows), "http://fallback:1");
        assert_eq!(p.ask.len(), 2);
        assert_eq!(p.ask[0].id.as_deref(), Some("a"));
        assert_eq!(p.ask[1].id, None);
    }

    #[test]
    fn no_live_daemon_in_the_registry_asks_the_configured_url() {
        for registry in [None, Some(&[][..])] {
            let p = plan(&[], registry, "http://127.0.0.1:8080");
            assert_eq!(p.ask.len(), 1);
            assert_eq!(p.ask[0].url, "http://127.0.0.1:8080");
        }
        // A daemon restarted on the same address: the live one only.
        let rows = [
            row(
                "old",
                "127.0.0.1:8080",
                EngineState::Dead,
                Some(DeadBecause::Stopped),
            ),
            row("new", "127.0.0.1:8080", EngineState::Live, None),
        ];
        let p = plan(&[], Some(&rows), "http://127.0.0.1:8080");
        assert_eq!(p.ask.len(), 1);
        assert!(p.dead.is_empty());
    }
}
