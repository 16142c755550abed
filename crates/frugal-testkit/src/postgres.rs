//! A throwaway PostgreSQL server for tests and benchmarks: `initdb` into a temporary
//! folder, `postgres` on a free loopback port, a fresh database per test, stopped when
//! dropped, or when the test process exits (a watcher stops a server a process leaves
//! behind, as the shared one is).
//!
//! `initdb` is found in `PATH` or under `/usr/lib/postgresql/*/bin` (Debian's
//! `postgresql` package). PostgreSQL refuses to run as root: as root, the server runs as
//! `nobody`, in a folder given to it.

use std::io;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::OnceLock;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use crate::free_port;

/// The superuser's password (loopback only, a temporary cluster).
pub const PASSWORD: &str = "frugal-test";

/// A new, empty database on the test process's shared server: its URL.
pub fn database() -> String {
    Server::shared()
        .and_then(Server::database)
        .unwrap_or_else(|e| panic!("PostgreSQL for this test: {e}"))
}

/// A running server; stopped and its folder removed when dropped.
pub struct Server {
    child: Child,
    /// How to start `postgres` on this server's folder again.
    bin: PathBuf,
    user: Option<(u32, u32)>,
    durable: bool,
    dir: PathBuf,
    port: u16,
    databases: AtomicU32,
}

fn other(message: String) -> io::Error {
    io::Error::other(message)
}

/// The folder holding `initdb` and `postgres`.
pub fn bin_dir() -> io::Result<PathBuf> {
    if let Some(path) = std::env::var_os("PATH") {
        for dir in std::env::split_paths(&path) {
            if dir.join("initdb").is_file() && dir.join("postgres").is_file() {
                return Ok(dir);
            }
            // Debian's /usr/bin/initdb is absent; its pg_ctl wrapper is not the server.
        }
    }
    let mut found: Vec<PathBuf> = std::fs::read_dir("/usr/lib/postgresql")
        .map(|d| {
            d.filter_map(Result::ok)
                .map(|e| e.path().join("bin"))
                .filter(|b| b.join("initdb").is_file())
                .collect()
        })
        .unwrap_or_default();
    found.sort_by_key(|p| {
        p.parent()
            .and_then(|v| v.file_name())
            .and_then(|v| v.to_str())
            .and_then(|v| v.parse::<u32>().ok())
            .unwrap_or(0)
    });
    found.pop().ok_or_else(|| {
        other("no PostgreSQL: install the `postgresql` package (initdb in PATH or /usr/lib/postgresql/*/bin)".into())
    })
}

/// The user and group ids the server runs as: `nobody` when this process is root.
fn run_as() -> Option<(u32, u32)> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let uid: u32 = status
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))?
        .split_whitespace()
        .next()?
        .parse()
        .ok()?;
    if uid != 0 {
        return None;
    }
    let passwd = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    let nobody = passwd.lines().find_map(|l| {
        let f: Vec<&str> = l.split(':').collect();
        (f.first() == Some(&"nobody") && f.len() > 3)
            .then(|| Some((f[2].parse().ok()?, f[3].parse().ok()?)))
            .flatten()
    });
    Some(nobody.unwrap_or((65534, 65534)))
}

/// `program` as `user`, in `dir` (the server's own folder: the test's working directory may
/// be one `nobody` cannot enter, as a checkout under /root is).
fn command(program: &Path, user: Option<(u32, u32)>, dir: &Path) -> Command {
    let mut cmd = Command::new(program);
    cmd.current_dir(dir);
    if let Some((uid, gid)) = user {
        use std::os::unix::process::CommandExt;
        cmd.uid(uid).gid(gid);
    }
    cmd.env("LC_ALL", "C").env_remove("PGDATA");
    cmd
}

impl Server {
    /// One server for the whole test process, stopped when the process exits.
    pub fn shared() -> io::Result<&'static Server> {
        static SHARED: OnceLock<Result<Server, String>> = OnceLock::new();
        SHARED
            .get_or_init(|| Server::start().map_err(|e| e.to_string()))
            .as_ref()
            .map_err(|e| other(e.clone()))
    }

    /// A server of its own, for a test that stops or breaks it.
    pub fn start() -> io::Result<Server> {
        Server::start_with(false)
    }

    /// A server that syncs its writes to disk, as a production one does: for benchmarks.
    pub fn start_durable() -> io::Result<Server> {
        Server::start_with(true)
    }

    fn start_with(durable: bool) -> io::Result<Server> {
        let bin = bin_dir()?;
        let user = run_as();
        let base =
            std::env::temp_dir().join(format!("frugal-pg-{}-{}", std::process::id(), free_port()?));
        std::fs::create_dir_all(&base)?;
        let data = base.join("data");
        let pwfile = base.join("pw");
        std::fs::write(&pwfile, PASSWORD)?;
        if let Some((uid, gid)) = user {
            std::os::unix::fs::chown(&base, Some(uid), Some(gid))?;
            std::os::unix::fs::chown(&pwfile, Some(uid), Some(gid))?;
        }
        let out = command(&bin.join("initdb"), user, &base)
            .args([
                "-U",
                "postgres",
                "-E",
                "UTF8",
                "--no-sync",
                "--auth-local=trust",
            ])
            .args(["--auth-host=scram-sha-256", "--pwfile"])
            .arg(&pwfile)
            .arg("-D")
            .arg(&data)
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            return Err(other(format!(
                "initdb failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )));
        }
        let port = free_port()?;
        let child = spawn(&bin, user, &base, port, durable)?;
        // Stops the server (and removes its folder) once this process is gone, however it
        // ends; a dropped `Server` does it sooner.
        let watcher = format!(
            "while [ -d /proc/{me} ]; do sleep 1; done; \
             pg=$(head -1 '{base}/data/postmaster.pid' 2>/dev/null); \
             [ -n \"$pg\" ] && kill -INT $pg 2>/dev/null; \
             while [ -n \"$pg\" ] && kill -0 $pg 2>/dev/null; do sleep 0.2; done; rm -rf '{base}'",
            me = std::process::id(),
            base = base.display()
        );
        command(Path::new("sh"), user, &base)
            .args(["-c", &watcher])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()?;
        let server = Server {
            child,
            bin,
            user,
            durable,
            dir: base,
            port,
            databases: AtomicU32::new(0),
        };
        server.wait_ready()?;
        Ok(server)
    }

    fn wait_ready(&self) -> io::Result<()> {
        self.wait_ready_for(Duration::from_secs(60))
    }

    fn wait_ready_for(&self, patience: Duration) -> io::Result<()> {
        let deadline = Instant::now() + patience;
        loop {
            match ::postgres::Client::connect(&self.url_of("postgres"), ::postgres::NoTls) {
                Ok(_) => return Ok(()),
                Err(e) if Instant::now() > deadline => {
                    let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
                    return Err(other(format!("PostgreSQL did not start: {e}\n{log}")));
                }
                Err(_) => std::thread::sleep(Duration::from_millis(100)),
            }
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    /// The URL of database `name` on this server, as the superuser.
    pub fn url_of(&self, name: &str) -> String {
        format!(
            "postgres://postgres:{PASSWORD}@127.0.0.1:{}/{name}",
            self.port
        )
    }

    /// A new, empty database; its URL.
    pub fn database(&self) -> io::Result<String> {
        let n = self.databases.fetch_add(1, Ordering::Relaxed);
        let name = format!("ledger_{}_{n}", std::process::id());
        let mut admin = ::postgres::Client::connect(&self.url_of("postgres"), ::postgres::NoTls)
            .map_err(|e| other(e.to_string()))?;
        admin
            .batch_execute(&format!("CREATE DATABASE {name}"))
            .map_err(|e| other(e.to_string()))?;
        Ok(self.url_of(&name))
    }

    /// Serves TLS with `cert` and `key` (PEM files), and from then on refuses connections
    /// over TCP without it, so a client that connects is known to have used TLS.
    pub fn require_tls(&self, cert: &Path, key: &Path) -> io::Result<()> {
        let data = self.dir.join("data");
        for (from, to) in [(cert, "server.crt"), (key, "server.key")] {
            let to = data.join(to);
            std::fs::copy(from, &to)?;
            // PostgreSQL refuses a key that others can read.
            std::fs::set_permissions(&to, std::os::unix::fs::PermissionsExt::from_mode(0o600))?;
            if let Some((uid, gid)) = self.user {
                std::os::unix::fs::chown(&to, Some(uid), Some(gid))?;
            }
        }
        let hba = data.join("pg_hba.conf");
        let rules = std::fs::read_to_string(&hba)?;
        let rules: String = rules
            .lines()
            .map(|l| match l.strip_prefix("host ") {
                Some(rest) => format!("hostssl {rest}\n"),
                None => format!("{l}\n"),
            })
            .collect();
        std::fs::write(&hba, rules)?;
        let mut admin = ::postgres::Client::connect(&self.url_of("postgres"), ::postgres::NoTls)
            .map_err(|e| other(e.to_string()))?;
        // One statement each: ALTER SYSTEM refuses to run in a transaction, which several
        // statements in one query are.
        for sql in ["ALTER SYSTEM SET ssl = on", "SELECT pg_reload_conf()"] {
            admin
                .batch_execute(sql)
                .map_err(|e| other(format!("{sql}: {e:?}")))?;
        }
        // The reload is asynchronous: wait until a plain connection is refused.
        let deadline = Instant::now() + Duration::from_secs(10);
        while ::postgres::Client::connect(&self.url_of("postgres"), ::postgres::NoTls).is_ok() {
            if Instant::now() > deadline {
                let log = std::fs::read_to_string(self.dir.join("log")).unwrap_or_default();
                return Err(other(format!("PostgreSQL did not turn TLS on\n{log}")));
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(())
    }

    /// Stops the server at once, as a crash or `kill -9` would.
    pub fn kill(&mut self) -> io::Result<()> {
        self.child.kill()?;
        self.child.wait().map(|_| ())
    }

    /// Freezes every process of the server (SIGSTOP): connections stay open and nothing
    /// answers, as with a hung host or a network that drops packets.
    pub fn freeze(&self) -> io::Result<()> {
        crate::signal_tree(self.child.id(), "STOP")
    }

    /// Thaws a frozen server (SIGCONT).
    pub fn thaw(&self) -> io::Result<()> {
        crate::signal_tree(self.child.id(), "CONT")
    }

    /// Starts a killed server again on its folder and port (recovering from its log),
    /// once the killed one's last processes have gone.
    pub fn restart(&mut self) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            self.child = spawn(&self.bin, self.user, &self.dir, self.port, self.durable)?;
            match self.wait_ready_for(Duration::from_secs(10)) {
                Ok(()) => return Ok(()),
                Err(e) if Instant::now() > deadline => return Err(e),
                Err(_) => {
                    let _ = self.child.kill();
                    let _ = self.child.wait();
                }
            }
        }
    }
}

/// `postgres` on `base/data`, listening on loopback at `port` and a socket in `base`.
fn spawn(
    bin: &Path,
    user: Option<(u32, u32)>,
    base: &Path,
    port: u16,
    durable: bool,
) -> io::Result<Child> {
    command(&bin.join("postgres"), user, base)
        .arg("-D")
        .arg(base.join("data"))
        .args(["-p", &port.to_string(), "-k"])
        .arg(base)
        .args(["-c", "listen_addresses=127.0.0.1", "-c"])
        .arg(if durable { "fsync=on" } else { "fsync=off" })
        .args(["-c", "max_connections=200"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(base.join("log"))?,
        )
        .spawn()
}

impl Drop for Server {
    fn drop(&mut self) {
        // A test that failed while the server was frozen must not wait here for ever.
        let _ = self.thaw();
        let _ = Command::new("kill")
            .args(["-INT", &self.child.id().to_string()])
            .status();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}
