//! A throwaway `redis-server` process.
//!
//! Readiness is detected by reading the server's log on stdout until it says "Ready to accept
//! connections", then confirmed with a `PING` over a plain TCP socket. Reading the log needs no
//! polling sleep, and the reader thread keeps draining stdout so the server never blocks on a
//! full pipe. The port comes from binding `127.0.0.1:0` and releasing it just before the server
//! starts; if another process takes it in between, the start is retried on a new port.
//! [`RedisServer::start_persistent`] keeps an append-only file in a temporary folder so a
//! restart keeps the data.

use std::io::{BufRead, BufReader, Read, Write};
use std::net::{Ipv4Addr, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// How long a server may take to say it is ready.
const READY_TIMEOUT: Duration = Duration::from_secs(10);
/// Start attempts on fresh ports before giving up (covers a port taken between bind and start).
const START_ATTEMPTS: usize = 3;

/// Errors starting a [`RedisServer`].
#[derive(Debug, thiserror::Error)]
pub enum RedisServerError {
    /// The binary is not on `PATH`.
    #[error(
        "redis-server not found on PATH ({0}); install it (Debian: `apt-get install redis-server`, \
         as .ci/run does) — Redis tests never skip"
    )]
    Missing(#[source] std::io::Error),
    /// Could not pick a port or talk to the server.
    #[error("failed to start redis-server: {0}")]
    Io(#[from] std::io::Error),
    /// The server exited or stayed silent.
    #[error("redis-server on port {port} did not become ready: {reason}")]
    NotReady {
        /// The port it was started on.
        port: u16,
        /// What went wrong, with the last log lines when any.
        reason: String,
    },
}

/// A `redis-server` child process on a free loopback port, without persistence
/// (`--save "" --appendonly no`). Killed when dropped.
#[derive(Debug)]
pub struct RedisServer {
    port: u16,
    child: Option<Child>,
    /// The data folder of a persistent server (removed on drop).
    dir: Option<PathBuf>,
}

impl RedisServer {
    /// Starts a server on a free port and waits until it answers `PING`.
    ///
    /// Errors: [`RedisServerError::Missing`] when `redis-server` is not installed (with the
    /// command to install it), [`RedisServerError::NotReady`] when it does not come up within
    /// 10 s.
    pub fn start() -> Result<RedisServer, RedisServerError> {
        Self::start_in(None)
    }

    /// Starts a server that persists every write to an append-only file
    /// (`--appendonly yes --appendfsync always`) in a fresh temporary folder, so
    /// [`RedisServer::restart`] (even after a kill) comes back with its data, as a production
    /// Redis configured for durability does. The folder is removed on drop.
    ///
    /// Errors: as [`RedisServer::start`], or the folder cannot be created.
    pub fn start_persistent() -> Result<RedisServer, RedisServerError> {
        static N: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = N.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("switchyard-redis-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir)?;
        Self::start_in(Some(dir))
    }

    fn start_in(dir: Option<PathBuf>) -> Result<RedisServer, RedisServerError> {
        let mut last = None;
        for _ in 0..START_ATTEMPTS {
            let port = free_port()?;
            match spawn_ready(port, dir.as_deref()) {
                Ok(child) => {
                    return Ok(RedisServer {
                        port,
                        child: Some(child),
                        dir,
                    });
                }
                Err(e @ RedisServerError::Missing(_)) => return Err(e),
                Err(e) => last = Some(e),
            }
        }
        Err(last.unwrap_or(RedisServerError::NotReady {
            port: 0,
            reason: "no attempt made".into(),
        }))
    }

    /// The server's URL, `redis://127.0.0.1:<port>/`.
    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// The server's port.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Whether the server process is running (not stopped).
    pub fn is_running(&self) -> bool {
        self.child.is_some()
    }

    /// Kills the server (an outage). Its data is lost: nothing is persisted. Idempotent.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            // A frozen server must run again to die promptly.
            let _ = Command::new("kill")
                .arg("-CONT")
                .arg(child.id().to_string())
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Freezes the server (`SIGSTOP`): connections stay open but nothing answers, the way a
    /// hung or partitioned server looks to a client with a timeout. Undo with
    /// [`RedisServer::resume`]. Errors: the `kill` command failed or the server is stopped.
    pub fn freeze(&self) -> Result<(), RedisServerError> {
        self.signal("-STOP")
    }

    /// Lets a frozen server run again (`SIGCONT`).
    pub fn resume(&self) -> Result<(), RedisServerError> {
        self.signal("-CONT")
    }

    fn signal(&self, sig: &str) -> Result<(), RedisServerError> {
        let Some(child) = &self.child else {
            return Err(RedisServerError::NotReady {
                port: self.port,
                reason: "server is stopped".into(),
            });
        };
        // std offers no signal but SIGKILL, and the workspace forbids unsafe FFI.
        let status = Command::new("kill")
            .arg(sig)
            .arg(child.id().to_string())
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(RedisServerError::Io(std::io::Error::other(format!(
                "kill {sig} exited with {status}"
            ))))
        }
    }

    /// Starts the server again on the same port and waits until it answers `PING`: empty, as
    /// after a crash without persistence, or with its data for a
    /// [`RedisServer::start_persistent`] server. Stops it first if it is running.
    ///
    /// Errors: as [`RedisServer::start`]; the port may have been taken meanwhile.
    pub fn restart(&mut self) -> Result<(), RedisServerError> {
        self.stop();
        self.child = Some(spawn_ready(self.port, self.dir.as_deref())?);
        Ok(())
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.stop();
        if let Some(dir) = self.dir.take() {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

fn free_port() -> std::io::Result<u16> {
    let listener = TcpListener::bind((Ipv4Addr::LOCALHOST, 0))?;
    Ok(listener.local_addr()?.port())
}

fn spawn_ready(port: u16, dir: Option<&Path>) -> Result<Child, RedisServerError> {
    let mut cmd = Command::new("redis-server");
    cmd.args(["--port", &port.to_string()]).args(["--save", ""]);
    match dir {
        Some(d) => {
            cmd.args(["--appendonly", "yes", "--appendfsync", "always"])
                .arg("--dir")
                .arg(d);
        }
        None => {
            cmd.args(["--appendonly", "no"]);
        }
    }
    let mut child = cmd
        .args(["--bind", "127.0.0.1"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| {
            if e.kind() == std::io::ErrorKind::NotFound {
                RedisServerError::Missing(e)
            } else {
                RedisServerError::Io(e)
            }
        })?;
    let not_ready = |reason: String| RedisServerError::NotReady { port, reason };
    let Some(stdout) = child.stdout.take() else {
        let _ = child.kill();
        return Err(not_ready("no stdout pipe".into()));
    };
    let (tx, rx) = mpsc::channel::<String>();
    // Drains the log for the server's whole life; ends at EOF when the server exits.
    std::thread::spawn(move || {
        let mut lines = BufReader::new(stdout).lines();
        let mut ready_sent = false;
        let mut tail = Vec::new();
        for line in lines.by_ref().map_while(Result::ok) {
            if ready_sent {
                continue;
            }
            if line.contains("Ready to accept connections") {
                ready_sent = tx.send(String::new()).is_ok();
            } else {
                tail.push(line);
                if tail.len() > 5 {
                    tail.remove(0);
                }
            }
        }
        if !ready_sent {
            let _ = tx.send(format!("exited; last log lines: {}", tail.join(" | ")));
        }
    });
    match rx.recv_timeout(READY_TIMEOUT) {
        Ok(msg) if msg.is_empty() => {}
        Ok(msg) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(not_ready(msg));
        }
        Err(_) => {
            let _ = child.kill();
            let _ = child.wait();
            return Err(not_ready(format!("silent for {READY_TIMEOUT:?}")));
        }
    }
    if let Err(e) = ping(port) {
        let _ = child.kill();
        let _ = child.wait();
        return Err(not_ready(format!("PING failed: {e}")));
    }
    Ok(child)
}

/// One inline `PING` over a fresh socket; expects `+PONG`.
fn ping(port: u16) -> std::io::Result<()> {
    let addr = SocketAddr::from((Ipv4Addr::LOCALHOST, port));
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(2))?;
    stream.set_read_timeout(Some(Duration::from_secs(2)))?;
    stream.write_all(b"PING\r\n")?;
    let mut buf = [0u8; 7];
    stream.read_exact(&mut buf)?;
    if &buf == b"+PONG\r\n" {
        Ok(())
    } else {
        Err(std::io::Error::other(format!(
            "unexpected answer {:?}",
            String::from_utf8_lossy(&buf)
        )))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn redis_server_stop_restart_answers_ping_on_same_port() {
        let mut server = RedisServer::start().unwrap();
        let port = server.port();
        assert!(server.url().ends_with(&format!(":{port}/")));
        ping(port).unwrap();
        server.stop();
        assert!(!server.is_running());
        assert!(ping(port).is_err());
        server.restart().unwrap();
        assert_eq!(server.port(), port);
        ping(port).unwrap();
        server.freeze().unwrap();
        assert!(ping(port).is_err(), "a frozen server does not answer");
        server.resume().unwrap();
        ping(port).unwrap();
    }
}
