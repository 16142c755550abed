//! A throwaway `redis-server` for tests: a free loopback port, nothing saved to disk,
//! killed when dropped; it can be killed and started again on the same port (empty, as a
//! Redis without persistence comes back), or paused and resumed.

use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Redis {
    child: Option<Child>,
    port: u16,
    pub url: String,
}

impl Redis {
    /// Starts one; fails with a clear error when `redis-server` is not installed.
    pub fn start() -> io::Result<Redis> {
        // A free port can be taken by another test's server before this one binds it: that
        // server then answers here and vanishes with its test. Ours must be the one answering,
        // so a start that lost its port tries another.
        let mut last = None;
        for _ in 0..5 {
            let port = crate::free_port()?;
            let mut redis = Redis {
                child: None,
                port,
                url: format!("redis://127.0.0.1:{port}/"),
            };
            match redis.restart() {
                Ok(()) => return Ok(redis),
                Err(e) if e.kind() == io::ErrorKind::AddrInUse => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| io::Error::other("redis-server did not start")))
    }

    /// Kills the server (no shutdown, as a crash).
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// Pauses the server (SIGSTOP): connections stay open and commands wait, unanswered,
    /// until [`Redis::resume`], as in a long GC pause or a stalled host.
    pub fn pause(&self) {
        self.signal("-STOP");
    }

    /// Resumes a paused server (SIGCONT): it runs the commands that waited.
    pub fn resume(&self) {
        self.signal("-CONT");
    }

    fn signal(&self, which: &str) {
        if let Some(child) = &self.child {
            let sent = Command::new("kill")
                .args([which, &child.id().to_string()])
                .status();
            assert!(sent.is_ok_and(|s| s.success()), "kill {which} redis-server");
        }
    }

    /// Starts the server again on its port, empty.
    pub fn restart(&mut self) -> io::Result<()> {
        self.kill();
        let child = Command::new("redis-server")
            .args(["--port", &self.port.to_string(), "--bind", "127.0.0.1"])
            .args(["--save", "", "--appendonly", "no"])
            .stdout(Stdio::null())
            .spawn()
            .map_err(|e| {
                io::Error::other(format!(
                    "redis-server is needed (Debian: apt-get install redis-server): {e}"
                ))
            })?;
        self.child = Some(child);
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            // Exited: its port was taken (the only way a fresh server stops on its own).
            if let Some(child) = &mut self.child
                && child.try_wait()?.is_some()
            {
                self.child = None;
                return Err(io::Error::new(
                    io::ErrorKind::AddrInUse,
                    format!("redis-server could not bind port {}", self.port),
                ));
            }
            if self.answering_pid() == self.child.as_ref().map(Child::id) {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(io::Error::other("redis-server did not start within 10 s"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// The process id of the server answering on the port, by `INFO server`.
    fn answering_pid(&self) -> Option<u32> {
        let mut stream = TcpStream::connect(("127.0.0.1", self.port)).ok()?;
        stream.set_read_timeout(Some(Duration::from_secs(1))).ok()?;
        stream.write_all(b"INFO server\r\n").ok()?;
        let mut text = Vec::new();
        let mut chunk = [0u8; 4096];
        // The reply is one bulk string; process_id comes early in it.
        while !String::from_utf8_lossy(&text).contains("\nrun_id:") {
            let n = stream.read(&mut chunk).ok().filter(|&n| n > 0)?;
            text.extend_from_slice(&chunk[..n]);
        }
        String::from_utf8_lossy(&text)
            .lines()
            .find_map(|l| l.strip_prefix("process_id:"))
            .and_then(|pid| pid.trim().parse().ok())
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}
