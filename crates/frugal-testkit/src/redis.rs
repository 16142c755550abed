//! A throwaway `redis-server` for tests: a free loopback port, nothing saved to disk,
//! killed when dropped; it can be killed and started again on the same port (empty, as a
//! Redis without persistence comes back), or paused and resumed.

use std::io;
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
        let port = crate::free_port()?;
        let mut redis = Redis {
            child: None,
            port,
            url: format!("redis://127.0.0.1:{port}/"),
        };
        redis.restart()?;
        Ok(redis)
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
        while TcpStream::connect(("127.0.0.1", self.port)).is_err() {
            if Instant::now() > deadline {
                return Err(io::Error::other("redis-server did not start within 10 s"));
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(())
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}
