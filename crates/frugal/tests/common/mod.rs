//! The harness of the end-to-end tests: `frugal serve` as a child process on loopback,
//! spoken to over raw HTTP/1.1.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic, dead_code)]

use std::io::{BufRead, BufReader, Read, Write};
use std::net::TcpStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// What a command printed, stdout then stderr.
pub fn said(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

pub fn model() -> PathBuf {
    frugal_testkit::test_model(frugal_engine::DEFAULT_MODEL)
}

/// The semantic cache's embedder, which `frugal serve` loads by default.
pub fn embedder() -> PathBuf {
    frugal_testkit::repo(frugal_semantic::DEFAULT_EMBEDDER)
}

/// `frugal ARGS serve --model <test model>` that must not start: its stderr.
pub fn serve_error(args: &[&str]) -> String {
    let out = Command::new(env!("CARGO_BIN_EXE_frugal"))
        .args(args)
        .arg("--model")
        .arg(model())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1), "{out:?}");
    String::from_utf8_lossy(&out.stderr).into_owned()
}

pub struct Server {
    child: Child,
    pub addr: String,
    /// Taken by `stop`, so the ledger outlives the server.
    dir: Option<tempfile::TempDir>,
    /// Its stderr, line by line.
    said: Arc<Mutex<Vec<String>>>,
}

impl Server {
    pub fn start(extra: &[&str]) -> Server {
        Server::start_with_files(&[], extra)
    }

    /// With `files` (name, text) written to the server's own folder first; a
    /// `frugal.toml` among them is its config.
    pub fn start_with_files(files: &[(&str, &str)], extra: &[&str]) -> Server {
        Server::start_in(tempfile::tempdir().unwrap(), files, extra)
    }

    /// In `dir` (a stopped server's, to start again over its ledger).
    pub fn start_in(dir: tempfile::TempDir, files: &[(&str, &str)], extra: &[&str]) -> Server {
        Server::start_env(dir, files, extra, &[])
    }

    /// With environment variables `envs` set for the server.
    pub fn start_env(
        dir: tempfile::TempDir,
        files: &[(&str, &str)],
        extra: &[&str],
        envs: &[(&str, &str)],
    ) -> Server {
        Server::start_full(dir, files, extra, envs, None)
    }

    /// Metering into `ledger` (a path or a `postgres://` URL) rather than its folder's.
    #[allow(dead_code)]
    pub fn start_on_ledger(ledger: &str, extra: &[&str]) -> Server {
        Server::start_full(tempfile::tempdir().unwrap(), &[], extra, &[], Some(ledger))
    }

    /// In `dir`, metering into `ledger`, with `files` (name, text) in its folder first.
    #[allow(dead_code)]
    pub fn start_on_ledger_in(
        dir: tempfile::TempDir,
        ledger: &str,
        files: &[(&str, &str)],
        extra: &[&str],
    ) -> Server {
        Server::start_full(dir, files, extra, &[], Some(ledger))
    }

    fn start_full(
        dir: tempfile::TempDir,
        files: &[(&str, &str)],
        extra: &[&str],
        envs: &[(&str, &str)],
        ledger: Option<&str>,
    ) -> Server {
        let mut command = Command::new(env!("CARGO_BIN_EXE_frugal"));
        if ledger.is_some() {
            // What a PostgreSQL ledger's gateway keeps in frugal's data folder (the spool,
            // batches) stays in this server's folder, not the user's.
            command.env("XDG_DATA_HOME", dir.path());
        }
        command.envs(envs.iter().copied());
        for (name, text) in files {
            let path = dir.path().join(name);
            std::fs::write(&path, text).unwrap();
            if *name == "frugal.toml" {
                command.arg("--config").arg(path);
            }
        }
        let ledger = ledger.map_or_else(
            || dir.path().join("ledger.sqlite").into_os_string(),
            std::ffi::OsString::from,
        );
        command
            .arg("--ledger")
            .arg(ledger)
            .args(["serve", "--port", "0", "--price-per-hour", "3.6"])
            .args(if extra.contains(&"--no-model") {
                vec![]
            } else {
                vec![std::ffi::OsString::from("--model"), model().into()]
            })
            .arg("--embedder")
            .arg(embedder())
            .args(extra);
        Server::launch(command, dir)
    }

    /// Run from `cwd` with `HOME` at `home` (and no `XDG_DATA_HOME`), naming no embedder:
    /// a user's first run outside the checkout.
    pub fn start_elsewhere(cwd: &Path, home: &Path, extra: &[&str]) -> Server {
        let dir = tempfile::tempdir().unwrap();
        let mut command = Command::new(env!("CARGO_BIN_EXE_frugal"));
        command
            .current_dir(cwd)
            .env("HOME", home)
            .env_remove("XDG_DATA_HOME")
            .arg("--ledger")
            .arg(dir.path().join("ledger.sqlite"))
            .args(["serve", "--port", "0", "--price-per-hour", "3.6", "--model"])
            .arg(model())
            .args(extra);
        Server::launch(command, dir)
    }

    /// Spawns `command` and waits for the address it listens on.
    pub fn launch(mut command: Command, dir: tempfile::TempDir) -> Server {
        let mut child = command.stderr(Stdio::piped()).spawn().unwrap();
        let stderr = child.stderr.take().unwrap();
        let said = Arc::new(Mutex::new(Vec::new()));
        let (tx, rx) = std::sync::mpsc::channel();
        let lines = said.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines().map_while(Result::ok) {
                // Kept before the address is sent: a test that reads the logs once the
                // server is up finds its start line there.
                let addr = line
                    .split("http://")
                    .nth(1)
                    .map(|rest| rest.split('/').next().unwrap_or_default().to_owned());
                lines.lock().unwrap().push(line);
                if let Some(addr) = addr {
                    let _ = tx.send(addr);
                }
            }
        });
        let addr = rx
            .recv_timeout(Duration::from_secs(120))
            .expect("the server did not start");
        Server {
            child,
            addr,
            dir: Some(dir),
            said,
        }
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// The lines the server wrote to stderr so far.
    pub fn stderr(&self) -> Vec<String> {
        self.said.lock().unwrap().clone()
    }

    /// What the server has logged so far, as one text.
    pub fn logs(&self) -> String {
        self.stderr().join("\n")
    }

    pub fn request(&self, method: &str, path: &str, body: &str) -> (u16, String, String) {
        self.request_with(method, path, body, "")
    }

    /// `headers`: extra header lines, each ending in \r\n.
    pub fn request_with(
        &self,
        method: &str,
        path: &str,
        body: &str,
        headers: &str,
    ) -> (u16, String, String) {
        request_at(&self.addr, method, path, body, headers)
    }

    /// A handle for another thread to send requests with.
    pub fn attach(addr: &str) -> Client {
        Client {
            addr: addr.to_owned(),
        }
    }

    /// The server's folder (its ledger, its pools' logs).
    pub fn dir(&self) -> &Path {
        self.dir.as_ref().unwrap().path()
    }

    pub fn json(&self, path: &str, body: &str) -> (u16, serde_json::Value) {
        let (status, _, body) = self.request("POST", path, body);
        (
            status,
            serde_json::from_str(&body).unwrap_or_else(|e| panic!("{e}: {body}")),
        )
    }

    /// A deterministic chat question that must succeed: the response head and the answer.
    pub fn ask(&self, question: &str, max_tokens: u32) -> (String, String) {
        let body = serde_json::json!({
            "messages": [{ "role": "user", "content": question }],
            "max_tokens": max_tokens,
            "temperature": 0,
        })
        .to_string();
        let (status, head, text) = self.request("POST", "/v1/chat/completions", &body);
        assert_eq!(status, 200, "{text}");
        let v: serde_json::Value = serde_json::from_str(&text).unwrap();
        let content = v["choices"][0]["message"]["content"].as_str().unwrap();
        (head, content.to_owned())
    }

    pub fn metric(&self, name: &str) -> f64 {
        let (_, _, body) = self.request("GET", "/metrics", "");
        body.lines()
            .find_map(|l| l.strip_prefix(name).and_then(|v| v.trim().parse().ok()))
            .unwrap_or(f64::NAN)
    }

    /// What `lever` saved, over every model and route (0 before it saved anything).
    pub fn saved(&self, lever: &str) -> f64 {
        let (_, _, body) = self.request("GET", "/metrics", "");
        let prefix = format!("frugal_saved_usd_total{{lever=\"{lever}\",model=");
        body.lines()
            .filter(|l| l.starts_with(&prefix))
            .map(|l| l.rsplit(' ').next().unwrap().parse::<f64>().unwrap())
            .sum()
    }

    /// SIGKILL, as a crash; hands back the folder.
    #[allow(dead_code)]
    pub fn kill(mut self) -> tempfile::TempDir {
        self.child.kill().unwrap();
        self.child.wait().unwrap();
        self.dir.take().unwrap()
    }

    /// SIGTERM, then wait for a clean exit; hands back the folder with the ledger.
    pub fn stop(mut self) -> (std::process::ExitStatus, tempfile::TempDir) {
        Command::new("kill")
            .arg("-TERM")
            .arg(self.child.id().to_string())
            .status()
            .unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            if let Some(status) = self.child.try_wait().unwrap() {
                return (status, self.dir.take().unwrap());
            }
            assert!(
                Instant::now() < deadline,
                "the server did not stop on SIGTERM"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
    }
}

/// Sends requests to a server another thread owns.
pub struct Client {
    pub addr: String,
}

impl Client {
    pub fn request(&self, method: &str, path: &str, body: &str) -> (u16, String, String) {
        request_at(&self.addr, method, path, body, "")
    }
}

/// One HTTP/1.1 request on a connection of its own: status, head and body.
pub fn request_at(
    addr: &str,
    method: &str,
    path: &str,
    body: &str,
    headers: &str,
) -> (u16, String, String) {
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(120))).unwrap();
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n{headers}Connection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut out = String::new();
    s.read_to_string(&mut out).unwrap();
    let (head, body) = out.split_once("\r\n\r\n").unwrap_or((&out, ""));
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    (status, head.to_owned(), body.to_owned())
}

/// A response header's value (names compared without case).
pub fn header<'a>(head: &'a str, name: &str) -> Option<&'a str> {
    head.lines().find_map(|l| {
        let (k, v) = l.split_once(':')?;
        k.eq_ignore_ascii_case(name).then(|| v.trim())
    })
}

/// What a response says it saved (`x-frugal-saved-usd`).
pub fn saved_usd(head: &str) -> f64 {
    header(head, "x-frugal-saved-usd").unwrap().parse().unwrap()
}

/// The text of an SSE chat stream, and whether it ended with [DONE].
pub fn streamed_text(sse: &str) -> (String, bool) {
    let mut text = String::new();
    let mut done = false;
    for data in sse.lines().filter_map(|l| l.strip_prefix("data: ")) {
        if data == "[DONE]" {
            done = true;
            continue;
        }
        let v: serde_json::Value = serde_json::from_str(data).unwrap();
        if let Some(t) = v["choices"][0]["delta"]["content"].as_str() {
            text.push_str(t);
        }
    }
    (text, done)
}

/// `frugal report` on `ledger`, with `args`: its standard output.
pub fn report(ledger: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> String {
    report_with(Command::new(env!("CARGO_BIN_EXE_frugal")), ledger, args)
}

/// [`report`] with frugal's data folder (the quality record) in `xdg_data_home`.
pub fn report_with_data_home(
    ledger: impl AsRef<std::ffi::OsStr>,
    xdg_data_home: &str,
    args: &[&str],
) -> String {
    let mut command = Command::new(env!("CARGO_BIN_EXE_frugal"));
    command.env("XDG_DATA_HOME", xdg_data_home);
    report_with(command, ledger, args)
}

fn report_with(mut command: Command, ledger: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> String {
    let out = command
        .arg("--ledger")
        .arg(ledger)
        .arg("report")
        .args(args)
        .output()
        .unwrap();
    assert!(out.status.success(), "{out:?}");
    String::from_utf8(out.stdout).unwrap()
}
