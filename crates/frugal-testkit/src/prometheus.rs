//! A throwaway Prometheus server scraping one target every second, on a free loopback
//! port; killed when dropped. Needs `prometheus` installed (Debian: `apt-get install
//! prometheus`).

use std::io::{Read, Write};
use std::net::TcpStream;
use std::process::{Child, Command, Stdio};
use std::time::Duration;

pub struct Prometheus {
    child: Child,
    pub addr: String,
    _dir: tempfile::TempDir,
}

impl Prometheus {
    /// Scrapes `target` (`host:port`, its `/metrics`) as job `chat`, labelling its series
    /// `node_type="g5.xlarge"`.
    pub fn start(target: &str) -> Prometheus {
        let dir = tempfile::tempdir().unwrap();
        let port = crate::free_port().unwrap();
        let config = format!(
            "global:\n  scrape_interval: 1s\nscrape_configs:\n  - job_name: chat\n    static_configs:\n      - targets: ['{target}']\n        labels:\n          node_type: g5.xlarge\n"
        );
        std::fs::write(dir.path().join("prometheus.yml"), config).unwrap();
        let child = Command::new("prometheus")
            .current_dir(dir.path())
            .arg("--config.file=prometheus.yml")
            .arg("--storage.tsdb.path=data")
            .arg(format!("--web.listen-address=127.0.0.1:{port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("prometheus is needed for this test (Debian: apt-get install prometheus)");
        Prometheus {
            child,
            addr: format!("127.0.0.1:{port}"),
            _dir: dir,
        }
    }

    /// The value of an instant query's first series, once Prometheus answers with one.
    /// HTTP/1.0 on a connection that may not be up yet: Prometheus may chunk an HTTP/1.1
    /// answer.
    pub fn value(&self, promql: &str) -> Option<f64> {
        let mut stream = TcpStream::connect(&self.addr).ok()?;
        let query: String = promql
            .bytes()
            .map(|b| match b {
                b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'_' => (b as char).to_string(),
                _ => format!("%{b:02X}"),
            })
            .collect();
        write!(
            stream,
            "GET /api/v1/query?query={query} HTTP/1.0\r\nHost: {}\r\n\r\n",
            self.addr
        )
        .ok()?;
        let mut answer = String::new();
        stream.read_to_string(&mut answer).ok()?;
        let json: serde_json::Value =
            serde_json::from_str(answer.split("\r\n\r\n").nth(1)?).ok()?;
        json["data"]["result"][0]["value"][1].as_str()?.parse().ok()
    }

    /// Waits (up to a minute) until `promql` reads at least `at_least`.
    pub fn wait_for(&self, promql: &str, at_least: f64) {
        crate::wait_until(
            Duration::from_secs(60),
            || self.value(promql).is_some_and(|v| v >= at_least),
            || format!("Prometheus never read {promql} >= {at_least}"),
        );
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
