//! Processes a drill started itself, held by the pid it recorded.
//!
//! A drill may only stop or restart what it started (docs/architecture.md
//! §13.5): a private server or an engine daemon spawned here. Every signal
//! goes to the pid of a child we hold, never to a name, and a child still
//! running when its [`Proc`] is dropped is killed with it.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, Command};

#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    #[error(
        "cannot start {name} ({program}): {source}; is it installed? (./scripts/stack.sh install)"
    )]
    Spawn {
        name: String,
        program: String,
        source: std::io::Error,
    },
    #[error("cannot open the log file {path}: {source}")]
    Log {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{name} exited ({status}) before it was ready; its log {log}:\n{tail}")]
    Exited {
        name: String,
        status: String,
        log: PathBuf,
        tail: String,
    },
    #[error("{name} was not ready after {waited:?}; see {log}")]
    NotReady {
        name: String,
        waited: Duration,
        log: PathBuf,
    },
}

/// The signals a drill sends. SIGSTOP and SIGCONT freeze and thaw a
/// process with its state: a consumer that stops taking messages.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    Term,
    Kill,
    Stop,
    Cont,
}

impl Signal {
    fn raw(self) -> libc::c_int {
        match self {
            Signal::Term => libc::SIGTERM,
            Signal::Kill => libc::SIGKILL,
            Signal::Stop => libc::SIGSTOP,
            Signal::Cont => libc::SIGCONT,
        }
    }
}

/// One child process, its pid and its log.
#[derive(Debug)]
pub struct Proc {
    name: String,
    child: Child,
    pid: u32,
    log: PathBuf,
}

impl Proc {
    /// Starts `cmd` with stdout and stderr appended to `log`.
    pub fn spawn(name: &str, cmd: &mut Command, log: &Path) -> Result<Self, ProcError> {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .map_err(|source| ProcError::Log {
                path: log.to_owned(),
                source,
            })?;
        let err = file.try_clone().map_err(|source| ProcError::Log {
            path: log.to_owned(),
            source,
        })?;
        let child = cmd
            .stdin(Stdio::null())
            .stdout(file)
            .stderr(err)
            .kill_on_drop(true)
            .spawn()
            .map_err(|source| ProcError::Spawn {
                name: name.to_owned(),
                program: format!("{:?}", cmd.as_std().get_program()),
                source,
            })?;
        let pid = child.id().unwrap_or(0);
        Ok(Self {
            name: name.to_owned(),
            child,
            pid,
            log: log.to_owned(),
        })
    }

    pub fn pid(&self) -> u32 {
        self.pid
    }

    /// Sends `sig` to this child, unless it has already been reaped (its pid
    /// may then belong to someone else).
    pub fn signal(&mut self, sig: Signal) {
        if self.exit_status().is_some() || self.pid == 0 {
            return;
        }
        // SAFETY: kill(2) with a pid we spawned and have not reaped yet.
        unsafe {
            libc::kill(self.pid as libc::pid_t, sig.raw());
        }
    }

    /// kill -9, then reap it.
    pub async fn kill9(&mut self) {
        self.signal(Signal::Kill);
        let _ = self.child.wait().await;
    }

    /// SIGTERM; SIGKILL if it has not exited within `grace`.
    pub async fn stop(&mut self, grace: Duration) {
        self.signal(Signal::Term);
        if tokio::time::timeout(grace, self.child.wait())
            .await
            .is_err()
        {
            self.kill9().await;
        }
    }

    /// The exit status, once it has exited.
    pub fn exit_status(&mut self) -> Option<std::process::ExitStatus> {
        self.child.try_wait().ok().flatten()
    }

    /// Fails with the log's tail when the process has exited.
    pub fn ensure_running(&mut self) -> Result<(), ProcError> {
        match self.exit_status() {
            None => Ok(()),
            Some(status) => Err(ProcError::Exited {
                name: self.name.clone(),
                status: status.to_string(),
                log: self.log.clone(),
                tail: tail(&self.log, 20),
            }),
        }
    }

    /// Polls `ready` every 100 ms until it holds, the process exits, or `limit` passes.
    pub async fn wait_ready<F, Fut>(
        &mut self,
        limit: Duration,
        mut ready: F,
    ) -> Result<(), ProcError>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = bool>,
    {
        let started = std::time::Instant::now();
        loop {
            self.ensure_running()?;
            if ready().await {
                return Ok(());
            }
            if started.elapsed() > limit {
                return Err(ProcError::NotReady {
                    name: self.name.clone(),
                    waited: limit,
                    log: self.log.clone(),
                });
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
}

/// The last `n` lines of a log, for an error message.
pub fn tail(path: &Path, n: usize) -> String {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// True when something accepts TCP connections on `addr`.
pub async fn port_open(addr: std::net::SocketAddr) -> bool {
    matches!(
        tokio::time::timeout(
            Duration::from_millis(300),
            tokio::net::TcpStream::connect(addr)
        )
        .await,
        Ok(Ok(_))
    )
}
