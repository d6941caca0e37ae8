//! Config layering for the binaries: defaults, then `seckill.toml`, then the
//! environment, then flags. The engine gets the finished [`Config`] and never
//! reads the environment itself (STYLE.md, Config).

use anyhow::{Context, Result, bail};
use seckill_engine::Config;
use secrecy::SecretString;
use std::collections::HashMap;
use std::path::{Path, PathBuf};

/// The environment variables that override the file.
pub const ENV_DATABASE_URL: &str = "SECKILL_DATABASE_URL";
pub const ENV_REDIS_URL: &str = "SECKILL_REDIS_URL";
/// `[redis] wait_replicas`: `stack.sh env --cluster` sets it to 1.
pub const ENV_REDIS_WAIT_REPLICAS: &str = "SECKILL_REDIS_WAIT_REPLICAS";
pub const ENV_NAMESRV_ADDR: &str = "SECKILL_NAMESRV_ADDR";
pub const ENV_TOPIC_PREFIX: &str = "SECKILL_TOPIC_PREFIX";
pub const ENV_CONFIG: &str = "SECKILL_CONFIG";
pub const ENV_ENGINE_URL: &str = "SECKILL_ENGINE_URL";
/// The bearer token for the engine's API (docs/security.md); `[auth]
/// token_file` names a file holding it instead.
pub const ENV_TOKEN: &str = "SECKILL_TOKEN";
/// `[log] otlp_endpoint`: where the daemon sends its spans; empty turns
/// the file's off.
pub const ENV_OTLP_ENDPOINT: &str = "SECKILL_OTLP_ENDPOINT";

/// Flags that override everything else.
#[derive(Debug, Default, Clone, clap::Args)]
pub struct ConfigFlags {
    /// Config file [default: ./seckill.toml when present; env SECKILL_CONFIG]
    #[arg(long, global = true, value_name = "PATH")]
    pub config: Option<PathBuf>,
    /// PostgreSQL URL [env SECKILL_DATABASE_URL]
    #[arg(long, global = true, value_name = "URL", hide_env_values = true)]
    pub database_url: Option<String>,
    /// Redis URL [env SECKILL_REDIS_URL]
    #[arg(long, global = true, value_name = "URL")]
    pub redis_url: Option<String>,
    /// RocketMQ NameServer address host:port [env SECKILL_NAMESRV_ADDR]
    #[arg(long, global = true, value_name = "ADDR")]
    pub namesrv_addr: Option<String>,
    /// Prefix for topics and consumer groups [env SECKILL_TOPIC_PREFIX]
    #[arg(long, global = true, value_name = "PREFIX")]
    pub topic_prefix: Option<String>,
    /// Running engines' HTTP addresses, comma-separated, for engine-side figures [default: every live engine of the registry; env SECKILL_ENGINE_URL]
    #[arg(long, global = true, value_name = "URL")]
    pub engine_url: Option<String>,
    /// Refuse every mutation (also `[auth] readonly = true`)
    #[arg(long, global = true)]
    pub readonly: bool,
    /// Break glass: send this command's mutations over the database URL,
    /// not through the engine's operator API (audited as direct)
    #[arg(long, global = true)]
    pub direct: bool,
}

/// Builds the config from the real process environment and the working directory.
pub fn load(flags: &ConfigFlags) -> Result<Config> {
    let env: HashMap<String, String> = std::env::vars().collect();
    layer(flags, &env, Path::new("."))
}

/// Pure layering over an explicit environment, so it can be tested.
pub fn layer(flags: &ConfigFlags, env: &HashMap<String, String>, cwd: &Path) -> Result<Config> {
    let explicit = flags
        .config
        .clone()
        .or_else(|| env.get(ENV_CONFIG).map(PathBuf::from));
    let mut cfg = match explicit {
        Some(path) => read_file(&path)?,
        None => {
            let default = cwd.join("seckill.toml");
            if default.exists() {
                read_file(&default)?
            } else {
                Config::default()
            }
        }
    };
    let pick = |flag: &Option<String>, var: &str| -> Option<String> {
        flag.clone().or_else(|| env.get(var).cloned())
    };
    if let Some(v) = pick(&flags.database_url, ENV_DATABASE_URL) {
        cfg.database_url = SecretString::from(v);
    }
    if let Some(v) = pick(&flags.redis_url, ENV_REDIS_URL) {
        cfg.redis_url = SecretString::from(v);
    }
    if let Some(v) = env.get(ENV_REDIS_WAIT_REPLICAS) {
        cfg.redis.wait_replicas = v.trim().parse().with_context(|| {
            format!("{ENV_REDIS_WAIT_REPLICAS}={v:?} is not a replica count (0, 1, ...)")
        })?;
    }
    if let Some(v) = pick(&flags.namesrv_addr, ENV_NAMESRV_ADDR) {
        cfg.namesrv_addr = v;
    }
    if let Some(v) = pick(&flags.topic_prefix, ENV_TOPIC_PREFIX) {
        cfg.topic_prefix = v;
    }
    if let Some(v) = pick(&flags.engine_url, ENV_ENGINE_URL) {
        // A list reads exactly those engines; the first also takes the
        // operator API's requests.
        let urls: Vec<String> = v
            .split(',')
            .map(|u| u.trim().trim_end_matches('/').to_owned())
            .filter(|u| !u.is_empty())
            .collect();
        if urls.is_empty() {
            bail!(
                "--engine-url {v:?} names no engine; give http://host:port[,http://host:port...]"
            );
        }
        cfg.engine_url = urls[0].clone();
        cfg.engine_urls = urls;
    }
    if let Some(v) = env.get(ENV_OTLP_ENDPOINT) {
        cfg.log.otlp_endpoint = Some(v.trim().to_owned()).filter(|v| !v.is_empty());
    }
    cfg.auth.readonly |= flags.readonly;
    cfg.auth.direct = flags.direct;
    cfg.auth.token = match env.get(ENV_TOKEN).filter(|t| !t.trim().is_empty()) {
        Some(t) => Some(SecretString::from(t.trim().to_owned())),
        None => match &cfg.auth.token_file {
            Some(path) => Some(read_token_file(path)?),
            None => None,
        },
    };
    validate(&cfg)?;
    Ok(cfg)
}

/// The token alone in a file; an empty or unreadable one is an error that
/// names the file, not a silent anonymous call.
fn read_token_file(path: &Path) -> Result<SecretString> {
    let text = std::fs::read_to_string(path).with_context(|| {
        format!(
            "cannot read [auth] token_file {}; write the token from `seckillctl auth token create` there, or set {ENV_TOKEN}",
            path.display()
        )
    })?;
    let token = text.trim();
    if token.is_empty() {
        bail!("[auth] token_file {} is empty", path.display());
    }
    Ok(SecretString::from(token.to_owned()))
}

fn read_file(path: &Path) -> Result<Config> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config file {}", path.display()))?;
    toml::from_str(&text).with_context(|| format!("invalid config file {}", path.display()))
}

fn validate(cfg: &Config) -> Result<()> {
    if let Some(e) = &cfg.log.otlp_endpoint {
        crate::logging::traces_url(e)?;
    }
    if !cfg
        .topic_prefix
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
    {
        bail!(
            "topic prefix {:?} may only contain letters, digits, '_' and '-' (RocketMQ topic rules)",
            cfg.topic_prefix
        );
    }
    // A lease is trusted for 80 % of its TTL from the renewal's send
    // (docs/architecture.md §14.4): renewals must come well within it, or
    // the roles flap between renewals; a daemon must beat more often than
    // it is judged dead.
    let r = &cfg.registry;
    if r.lease_ttl_ms < 2 * r.heartbeat_ms.max(100) {
        bail!(
            "[registry] lease_ttl_ms = {} must be at least twice heartbeat_ms = {} (the lease is renewed every heartbeat)",
            r.lease_ttl_ms,
            r.heartbeat_ms
        );
    }
    if r.dead_after_ms <= r.heartbeat_ms {
        bail!(
            "[registry] dead_after_ms = {} must be longer than heartbeat_ms = {}, or every daemon looks dead between beats",
            r.dead_after_ms,
            r.heartbeat_ms
        );
    }
    // A send that outlives its claim's lease lets another engine send the
    // same row at once (harmless, the inbox dedupes, but wasteful).
    let o = &cfg.outbox;
    if o.send_timeout_ms >= o.lease_ms {
        bail!(
            "[outbox] send_timeout_ms = {} must be shorter than lease_ms = {} (a send must end within its claim)",
            o.send_timeout_ms,
            o.lease_ms
        );
    }
    // Below the broker's retention a prune could take the inbox row of a
    // message the broker can still redeliver (docs/architecture.md §16.2).
    cfg.retention.validate(&cfg.dlq)?;
    if cfg.mq.send_timeout_ms == 0 || o.send_timeout_ms == 0 {
        bail!("[mq] send_timeout_ms and [outbox] send_timeout_ms must be above 0");
    }
    if cfg.namesrv_addr.rsplit_once(':').is_none() {
        bail!(
            "namesrv address {:?} must be host:port, e.g. 127.0.0.1:9876",
            cfg.namesrv_addr
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use secrecy::ExposeSecret;

    fn env(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect()
    }

    #[test]
    fn defaults_point_at_the_loopback_stack() {
        let dir = std::env::temp_dir().join(format!("seckill-cfg-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = layer(&ConfigFlags::default(), &env(&[]), &dir).unwrap();
        assert_eq!(cfg.namesrv_addr, "127.0.0.1:9876");
        assert!(cfg.database_url.expose_secret().contains("127.0.0.1"));
        assert_eq!(cfg.topic_prefix, "");
    }

    #[test]
    fn an_outbox_send_longer_than_its_lease_is_refused() {
        let dir = std::env::temp_dir().join(format!("seckill-cfg-ob-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("seckill.toml"),
            "[outbox]\nsend_timeout_ms = 20000\nlease_ms = 15000\n",
        )
        .unwrap();
        let err = layer(&ConfigFlags::default(), &env(&[]), &dir).unwrap_err();
        assert!(
            format!("{err:#}").contains("[outbox] send_timeout_ms"),
            "{err:#}"
        );
        std::fs::write(dir.join("seckill.toml"), "[mq]\nsend_timeout_ms = 0\n").unwrap();
        let err = layer(&ConfigFlags::default(), &env(&[]), &dir).unwrap_err();
        assert!(format!("{err:#}").contains("above 0"), "{err:#}");
    }

    #[test]
    fn a_lease_shorter_than_two_heartbeats_is_refused() {
        let dir = std::env::temp_dir().join(format!("seckill-cfg4-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("seckill.toml"),
            "[registry]\nheartbeat_ms = 1000\nlease_ttl_ms = 1500\n",
        )
        .unwrap();
        let err = layer(&ConfigFlags::default(), &env(&[]), &dir).unwrap_err();
        assert!(format!("{err:#}").contains("lease_ttl_ms"), "{err:#}");
    }

    #[test]
    fn an_engine_url_list_reads_those_engines() {
        let dir = std::env::temp_dir().join(format!("seckill-cfg3-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let none = layer(&ConfigFlags::default(), &env(&[]), &dir).unwrap();
        assert!(none.engine_urls.is_empty(), "the registry decides");
        let e = env(&[(ENV_ENGINE_URL, "http://a:1/, http://b:2")]);
        let two = layer(&ConfigFlags::default(), &e, &dir).unwrap();
        assert_eq!(two.engine_urls, ["http://a:1", "http://b:2"]);
        assert_eq!(two.engine_url, "http://a:1");
        let bad = env(&[(ENV_ENGINE_URL, " , ")]);
        assert!(layer(&ConfigFlags::default(), &bad, &dir).is_err());
    }

    #[test]
    fn file_then_env_then_flags() {
        let dir = std::env::temp_dir().join(format!("seckill-cfg2-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(
            dir.join("seckill.toml"),
            "namesrv_addr = \"10.0.0.1:9876\"\ntopic_prefix = \"FILE_\"\n[pg]\nmax_connections = 7\n",
        )
        .unwrap();
        let from_file = layer(&ConfigFlags::default(), &env(&[]), &dir).unwrap();
        assert_eq!(from_file.namesrv_addr, "10.0.0.1:9876");
        assert_eq!(from_file.pg.max_connections, 7);

        let e = env(&[(ENV_TOPIC_PREFIX, "ENV_")]);
        let from_env = layer(&ConfigFlags::default(), &e, &dir).unwrap();
        assert_eq!(from_env.topic_prefix, "ENV_");
        assert_eq!(from_env.namesrv_addr, "10.0.0.1:9876");

        let flags = ConfigFlags {
            topic_prefix: Some("FLAG_".into()),
            ..Default::default()
        };
        assert_eq!(layer(&flags, &e, &dir).unwrap().topic_prefix, "FLAG_");
    }

    #[test]
    fn a_cluster_url_and_its_replica_wait_come_from_the_environment() {
        let dir = std::env::temp_dir().join(format!("seckill-cfg5-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let cfg = layer(
            &ConfigFlags::default(),
            &env(&[
                (
                    ENV_REDIS_URL,
                    "redis://127.0.0.1:7001,redis://127.0.0.1:7002",
                ),
                (ENV_REDIS_WAIT_REPLICAS, "1"),
            ]),
            &dir,
        )
        .unwrap();
        assert_eq!(cfg.redis.wait_replicas, 1);
        assert_eq!(
            cfg.redis_url_redacted(),
            "redis://127.0.0.1:7001,redis://127.0.0.1:7002"
        );
        let bad = layer(
            &ConfigFlags::default(),
            &env(&[(ENV_REDIS_WAIT_REPLICAS, "one")]),
            &dir,
        )
        .unwrap_err();
        assert!(
            format!("{bad:#}").contains(ENV_REDIS_WAIT_REPLICAS),
            "{bad:#}"
        );
    }

    #[test]
    fn the_token_comes_from_the_environment_then_the_file() {
        let dir = std::env::temp_dir().join(format!("seckill-cfg-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let file = dir.join("token");
        std::fs::write(&file, "skt_from_file\n").unwrap();
        std::fs::write(
            dir.join("seckill.toml"),
            format!("[auth]\ntoken_file = {:?}\n", file.display().to_string()),
        )
        .unwrap();
        let cfg = layer(&ConfigFlags::default(), &env(&[]), &dir).unwrap();
        assert_eq!(cfg.auth.token.unwrap().expose_secret(), "skt_from_file");
        let cfg = layer(
            &ConfigFlags::default(),
            &env(&[(ENV_TOKEN, "skt_env")]),
            &dir,
        )
        .unwrap();
        assert_eq!(cfg.auth.token.unwrap().expose_secret(), "skt_env");
        std::fs::write(&file, "  \n").unwrap();
        let err = layer(&ConfigFlags::default(), &env(&[]), &dir).unwrap_err();
        assert!(format!("{err:#}").contains("is empty"), "{err:#}");
        let readonly = ConfigFlags {
            readonly: true,
            ..Default::default()
        };
        let cfg = layer(&readonly, &env(&[(ENV_TOKEN, "skt_env")]), &dir).unwrap();
        assert!(cfg.auth.readonly);
    }

    mod hostile {
        use super::*;
        use proptest::prelude::*;

        /// A TOML document of real sections and keys with values of any
        /// type, or of made-up ones: what a hand-edited file can hold.
        fn toml_text() -> impl Strategy<Value = String> {
            let section = prop::sample::select(vec![
                "",
                "pg",
                "mq",
                "publisher",
                "scanner",
                "consumer",
                "outbox",
                "lifecycle",
                "dlq",
                "alerts",
                "governor",
                "redis",
                "auth",
                "http",
                "nope",
            ]);
            let key = prop::sample::select(vec![
                "database_url",
                "namesrv_addr",
                "topic_prefix",
                "max_connections",
                "batch_max",
                "threads",
                "mode",
                "token_file",
                "readonly",
                "max_body_bytes",
                "max_concurrent",
                "refresh_ms",
                "x",
            ]);
            let value = prop_oneof![
                any::<i64>().prop_map(|n| n.to_string()),
                any::<bool>().prop_map(|b| b.to_string()),
                "\\PC{0,30}".prop_map(|s| format!("{s:?}")),
                Just("[1, \"a\", {x = 1}]".to_owned()),
                Just("1e400".to_owned()),
                "\\PC{0,20}",
            ];
            prop::collection::vec((section, key, value), 0..12).prop_map(|lines| {
                lines
                    .into_iter()
                    .map(|(sec, k, v)| {
                        if sec.is_empty() {
                            format!("{k} = {v}\n")
                        } else {
                            format!("[{sec}]\n{k} = {v}\n")
                        }
                    })
                    .collect()
            })
        }

        fn env_value() -> impl Strategy<Value = String> {
            prop_oneof!["\\PC{0,40}", Just(String::new()), Just(":".to_owned())]
        }

        proptest! {
            #![proptest_config(ProptestConfig::with_cases(256))]

            /// The loader over any file and any environment: a config that
            /// passes its own validation, or an error that names the file
            /// or the value; never a panic.
            #[test]
            fn any_file_and_environment_load_or_say_why(
                text in prop_oneof![toml_text(), "\\PC{0,200}"],
                prefix in env_value(),
                namesrv in env_value(),
                token in env_value(),
            ) {
                let dir = std::env::temp_dir().join(format!(
                    "seckill-cfg-prop-{}-{:?}",
                    std::process::id(),
                    std::thread::current().id()
                ));
                std::fs::create_dir_all(&dir).unwrap();
                let path = dir.join("seckill.toml");
                std::fs::write(&path, &text).unwrap();
                let e = env(&[
                    (ENV_TOPIC_PREFIX, prefix.as_str()),
                    (ENV_NAMESRV_ADDR, namesrv.as_str()),
                    (ENV_TOKEN, token.as_str()),
                ]);
                match layer(&ConfigFlags::default(), &e, &dir) {
                    Ok(cfg) => {
                        prop_assert!(validate(&cfg).is_ok());
                        prop_assert_eq!(cfg.topic_prefix, prefix);
                    }
                    Err(err) => {
                        let why = format!("{err:#}");
                        prop_assert!(!why.is_empty());
                    }
                }
            }
        }
    }

    #[test]
    fn bad_input_names_the_problem() {
        let dir = std::env::temp_dir().join(format!("seckill-cfg-bad-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("seckill.toml"), "no_such_key = 1\n").unwrap();
        let err = layer(&ConfigFlags::default(), &env(&[]), &dir).unwrap_err();
        assert!(format!("{err:#}").contains("no_such_key"), "{err:#}");

        let flags = ConfigFlags {
            topic_prefix: Some("bad prefix!".into()),
            config: Some(dir.join("missing.toml")),
            ..Default::default()
        };
        let err = layer(&flags, &env(&[]), &dir).unwrap_err();
        assert!(format!("{err:#}").contains("missing.toml"), "{err:#}");
    }
}
