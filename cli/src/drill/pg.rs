//! A private PostgreSQL cluster for the failover drill (docs/architecture.md
//! §13.5, row #4): its
//! own data directory and port, created with `initdb`, started, restarted
//! and stopped with `pg_ctl` on that directory only. The machine's own
//! server is never touched (docs/architecture.md §13.5).

use anyhow::{Context, Result, bail};
use std::path::{Path, PathBuf};
use tokio::process::Command;

/// How `pg_ctl` stops the server before starting it again.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RestartMode {
    /// Clean: sessions are ended, a checkpoint is written.
    Fast,
    /// Like a crash: no checkpoint, crash recovery on start.
    Immediate,
}

impl RestartMode {
    fn flag(self) -> &'static str {
        match self {
            RestartMode::Fast => "fast",
            RestartMode::Immediate => "immediate",
        }
    }
}

pub struct PrivatePg {
    bin: PathBuf,
    data: PathBuf,
    log: PathBuf,
    port: u16,
}

/// The server's programs: `SECKILL_PG_BINDIR`, else the newest
/// /usr/lib/postgresql/*/bin (Debian's layout, what stack.sh installs).
fn bindir() -> Result<PathBuf> {
    if let Some(dir) = std::env::var_os("SECKILL_PG_BINDIR") {
        return Ok(PathBuf::from(dir));
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .context("no /usr/lib/postgresql; install PostgreSQL (./scripts/stack.sh up) or set SECKILL_PG_BINDIR")?
        .filter_map(|e| e.ok().map(|e| e.path().join("bin")))
        .filter(|p| p.join("initdb").exists())
        .collect();
    found.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    found
        .pop()
        .context("no initdb under /usr/lib/postgresql/*/bin; set SECKILL_PG_BINDIR")
}

impl PrivatePg {
    /// `initdb` (trust on loopback, no fsync: a drill's data is thrown
    /// away) and start on `port`.
    pub async fn start(dir: &Path, port: u16) -> Result<Self> {
        let pg = Self {
            bin: bindir()?,
            data: dir.join("pgdata"),
            log: dir.join("postgres.log"),
            port,
        };
        if super::procs::port_open(format!("127.0.0.1:{port}").parse()?).await {
            bail!("port {port} is taken; is another drill running? (move it with --port-base)");
        }
        std::fs::create_dir_all(&pg.data)?;
        // initdb refuses to run as root; the cluster belongs to `postgres`.
        if is_root() {
            for p in [dir, &pg.data] {
                chown_postgres(p)?;
            }
            std::fs::write(&pg.log, "")?;
            chown_postgres(&pg.log)?;
        }
        pg.run(
            "initdb",
            &[
                "-D",
                &pg.data.to_string_lossy(),
                "-U",
                "postgres",
                "-A",
                "trust",
                "--no-sync",
            ],
        )
        .await?;
        pg.ctl(&["start", "-w", "-t", "60"]).await?;
        Ok(pg)
    }

    pub fn url(&self, db: &str) -> String {
        format!("postgres://postgres@127.0.0.1:{}/{db}", self.port)
    }

    pub async fn restart(&self, mode: RestartMode) -> Result<()> {
        self.ctl(&["restart", "-m", mode.flag(), "-w", "-t", "60"])
            .await
    }

    pub async fn stop(&self) {
        let _ = self.ctl(&["stop", "-m", "immediate", "-w"]).await;
    }

    async fn ctl(&self, args: &[&str]) -> Result<()> {
        let opts = format!(
            "-p {} -c listen_addresses=127.0.0.1 -k {} -c fsync=off -c max_connections=100",
            self.port,
            self.data.display()
        );
        let mut all = vec!["-D", self.data.to_str().unwrap_or_default(), "-l"];
        let log = self.log.to_string_lossy().into_owned();
        all.push(&log);
        all.extend(["-o", &opts]);
        all.extend_from_slice(args);
        self.run("pg_ctl", &all).await
    }

    /// Runs one of the server's programs, as `postgres` when we are root.
    async fn run(&self, program: &str, args: &[&str]) -> Result<()> {
        let exe = self.bin.join(program);
        let mut cmd = if is_root() {
            let mut c = Command::new("runuser");
            c.args(["-u", "postgres", "--"]).arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        let out = cmd
            .args(args)
            .output()
            .await
            .with_context(|| format!("run {}", exe.display()))?;
        if !out.status.success() {
            bail!(
                "{program} {} failed ({}): {}{}",
                args.join(" "),
                out.status,
                String::from_utf8_lossy(&out.stdout),
                String::from_utf8_lossy(&out.stderr)
            );
        }
        Ok(())
    }
}

fn is_root() -> bool {
    // SAFETY: getuid(2) has no preconditions.
    unsafe { libc::getuid() == 0 }
}

fn chown_postgres(p: &Path) -> Result<()> {
    let out = std::process::Command::new("chown")
        .args(["postgres:postgres"])
        .arg(p)
        .output()
        .context("chown")?;
    if !out.status.success() {
        bail!("chown postgres {} failed", p.display());
    }
    Ok(())
}
