//! `seckillctl engine run`: the daemon. Only the binary installs signal
//! handlers (STYLE.md, Async); the engine gets a shutdown future.

use crate::logging::Shape;
use anyhow::{Context, Result};
use seckill_engine::{ClientRuntime, Config};
use std::net::SocketAddr;
use std::sync::Arc;

#[derive(Debug, clap::Subcommand)]
pub enum EngineCmd {
    /// Run the publisher, scanner, order consumer and HTTP ingress until SIGTERM or Ctrl-C
    Run {
        /// Address for the HTTP surface
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: SocketAddr,
        /// Serve /healthz, /readyz and /metrics (open, no token) here
        /// instead of on --listen
        #[arg(long)]
        admin_listen: Option<SocketAddr>,
    },
}

async fn shutdown_signal() {
    let ctrl_c = tokio::signal::ctrl_c();
    #[cfg(unix)]
    {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                tokio::select! {
                    _ = ctrl_c => {}
                    _ = term.recv() => {}
                }
            }
            Err(_) => {
                let _ = ctrl_c.await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = ctrl_c.await;
    }
}

/// The daemon's own lines (where it listens, that it stopped): for a
/// person at the default `warn` filter, a plain line on stderr; in JSON
/// logs, an INFO event like every other, so the stream stays one object a
/// line.
fn say(shape: Shape, text: String) {
    match shape {
        Shape::Text => eprintln!("{text}"),
        Shape::Json => tracing::info!("{text}"),
    }
}

pub async fn run(cmd: EngineCmd, cfg: &Config, rt: Arc<ClientRuntime>, shape: Shape) -> Result<()> {
    match cmd {
        EngineCmd::Run {
            listen,
            admin_listen,
        } => {
            let api = tokio::net::TcpListener::bind(listen)
                .await
                .with_context(|| format!("cannot listen on {listen}; is another engine running there? (pick one with --listen)"))?;
            say(
                shape,
                format!("engine listening on http://{}", api.local_addr()?),
            );
            let admin = match admin_listen {
                Some(addr) => {
                    let l = tokio::net::TcpListener::bind(addr).await.with_context(|| {
                        format!(
                            "cannot listen on {addr} (--admin-listen); is something else there?"
                        )
                    })?;
                    say(
                        shape,
                        format!("probes and /metrics on http://{}", l.local_addr()?),
                    );
                    Some(l)
                }
                None => None,
            };
            let listeners = seckill_engine::Listeners { api, admin };
            seckill_engine::run_daemon(cfg.clone(), rt, listeners, shutdown_signal()).await?;
            say(shape, "engine stopped cleanly".to_owned());
            Ok(())
        }
    }
}
