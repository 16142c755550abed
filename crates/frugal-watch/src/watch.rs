//! One pass of `frugal watch` over its targets: each target's `/metrics` fetched, read,
//! and differenced against its previous snapshot into billed events. The snapshots are
//! kept in a state file, so `frugal watch --once` from cron bills the time between runs,
//! and a restart of the watcher loses nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use frugal_cost::money::{HourlyRate, Millis};
use serde::{Deserialize, Serialize};

use crate::expo::{Scrape, parse};
use crate::interval::{Bill, Interval, Snapshot, TargetMeta, bill};
use crate::reading::{Kind, Reading, detect};
use frugal_cost::causes::with_causes;

/// A server to watch, as configured.
#[derive(Debug, Clone)]
pub struct Target {
    pub meta: TargetMeta,
    pub url: String,
    /// `None`: detected from the metric names.
    pub kind: Option<Kind>,
    /// What its machine costs an hour.
    pub rate: HourlyRate,
    /// The machine it runs on, to join a DCGM exporter's GPUs to it: the URL's host unless
    /// the config names another (the node name DCGM labels its series with).
    pub host: String,
}

impl Target {
    /// The host part of a URL (`10.0.0.5` of `http://10.0.0.5:8000/metrics`).
    pub fn url_host(url: &str) -> String {
        let rest = url.split_once("://").map_or(url, |(_, r)| r);
        let authority = rest.split(['/', '?', '#']).next().unwrap_or(rest);
        let host = authority.rsplit_once('@').map_or(authority, |(_, h)| h);
        match host.strip_prefix('[') {
            Some(v6) => v6.split(']').next().unwrap_or(v6).to_owned(),
            None => host.split(':').next().unwrap_or(host).to_owned(),
        }
    }
}

/// What one target's scrape came to.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// The first reading: nothing to difference yet.
    Baseline(Reading),
    /// The work since the previous reading, and its ledger rows.
    Billed { interval: Interval, bill: Bill },
    /// No bill for this interval, and why (the next reading starts afresh).
    Gap(String),
    /// A DCGM exporter whose GPUs belong to these servers (on its host): read into their
    /// readings, never billed itself, so their time is paid once.
    Joined(Vec<String>),
}

/// The last snapshot of each target, by name.
#[derive(Debug, Default, Serialize, Deserialize)]
pub struct State {
    pub last: BTreeMap<String, Snapshot>,
}

#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot read the watch state {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the watch state {} is not what frugal wrote ({reason}): remove it to start afresh", path.display())]
    Corrupt { path: PathBuf, reason: String },
    #[error("cannot write the watch state {}", path.display())]
    Write {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
}

impl State {
    /// The state at `path`; empty where there is none yet.
    pub fn load(path: &Path) -> Result<State, StateError> {
        match std::fs::read_to_string(path) {
            Ok(text) => serde_json::from_str(&text).map_err(|e| StateError::Corrupt {
                path: path.to_owned(),
                reason: e.to_string(),
            }),
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(State::default()),
            Err(source) => Err(StateError::Read {
                path: path.to_owned(),
                source,
            }),
        }
    }

    /// Written whole, then renamed into place: a crash leaves the old state or the new.
    pub fn save(&self, path: &Path) -> Result<(), StateError> {
        let write = |source| StateError::Write {
            path: path.to_owned(),
            source,
        };
        let tmp = path.with_extension("tmp");
        let text = serde_json::to_string(self).map_err(|e| write(std::io::Error::other(e)))?;
        std::fs::write(&tmp, text).map_err(write)?;
        std::fs::rename(&tmp, path).map_err(write)
    }

    /// Reads every target's scrape (or why there is none) at `at_ms`, in order. A DCGM exporter on
    /// the host of one or more serving targets lends them its GPU utilization and memory
    /// and is not billed itself; one alone on its host is billed as a machine. A failed or
    /// unreadable scrape is a gap and forgets the last snapshot, so the time it covered is
    /// never billed as busy or idle.
    pub fn observe_all(
        &mut self,
        targets: &[Target],
        scrapes: Vec<Result<Scrape, String>>,
        at_ms: Millis,
    ) -> Vec<Outcome> {
        let mut readings: Vec<Result<Reading, String>> = targets
            .iter()
            .zip(scrapes)
            .map(|(t, scrape)| read(t, scrape))
            .collect();
        // A server whose scrape failed still owns its GPUs: its interval is a gap, and
        // the exporter's must not bill the same time.
        let serving = |r: &Result<Reading, String>, t: &Target| match r {
            Ok(r) => r.kind != Kind::Dcgm,
            Err(_) => t.kind != Some(Kind::Dcgm),
        };
        let mut joined: Vec<Option<Vec<String>>> = vec![None; targets.len()];
        for (g, gpu) in targets.iter().enumerate() {
            let Ok(dcgm) = readings[g].clone() else {
                continue;
            };
            if dcgm.kind != Kind::Dcgm {
                continue;
            }
            let on_host = |t: &Target| {
                t.host == gpu.host || dcgm.hostname.as_deref() == Some(t.host.as_str())
            };
            let servers: Vec<usize> = (0..targets.len())
                .filter(|&i| i != g && on_host(&targets[i]) && serving(&readings[i], &targets[i]))
                .collect();
            if servers.is_empty() {
                continue;
            }
            for &i in &servers {
                if let Ok(r) = &mut readings[i] {
                    *r = r.clone().with_gpu(&dcgm);
                }
            }
            joined[g] = Some(
                servers
                    .iter()
                    .map(|&i| targets[i].meta.name.clone())
                    .collect(),
            );
        }
        targets
            .iter()
            .zip(readings)
            .zip(joined)
            .map(|((t, reading), joined)| match joined {
                Some(servers) => {
                    self.last.remove(&t.meta.name);
                    Outcome::Joined(servers)
                }
                None => self.observe_reading(t, reading, at_ms),
            })
            .collect()
    }

    fn observe_reading(
        &mut self,
        target: &Target,
        reading: Result<Reading, String>,
        at_ms: Millis,
    ) -> Outcome {
        let name = &target.meta.name;
        let reading = match reading {
            Ok(r) => r,
            Err(why) => {
                self.last.remove(name);
                return Outcome::Gap(why);
            }
        };
        let next = Snapshot { at_ms, reading };
        let outcome = match self.last.get(name) {
            None => Outcome::Baseline(next.reading.clone()),
            Some(prev) => match Interval::between(prev, &next) {
                Ok(interval) => match bill(&target.meta, target.rate, prev.at_ms, &interval) {
                    Ok(bill) => Outcome::Billed { interval, bill },
                    Err(e) => Outcome::Gap(e.to_string()),
                },
                Err(gap) => Outcome::Gap(gap.to_string()),
            },
        };
        self.last.insert(name.clone(), next);
        outcome
    }
}

/// A fetched body parsed, or why there is none.
pub fn scrape_of(body: Result<String, String>) -> Result<Scrape, String> {
    parse(&body?).map_err(|e| e.to_string())
}

/// A target's scrape read as its kind (configured, or detected from the metric names).
fn read(target: &Target, scrape: Result<Scrape, String>) -> Result<Reading, String> {
    let scrape = scrape?;
    let kind = match target.kind {
        Some(k) => k,
        None => {
            detect(&scrape).ok_or("no vLLM, TGI, llama.cpp, frugal or DCGM metrics in the body")?
        }
    };
    Ok(Reading::new(kind, &scrape))
}

/// Scrapes targets' `/metrics` over one HTTP client.
#[derive(Debug)]
pub struct Scraper {
    client: reqwest::Client,
}

impl Default for Scraper {
    /// A new connection per scrape. Servers close idle keep-alive connections after a few
    /// seconds (llama-server's after 5), well inside a scrape interval, and a request sent
    /// on a connection the server just closed fails: each interval would be a gap.
    fn default() -> Scraper {
        let client = reqwest::Client::builder()
            .pool_max_idle_per_host(0)
            .build()
            .unwrap_or_default();
        Scraper { client }
    }
}

impl Scraper {
    /// Every target's body at once, in order; any failure (down, slow, not 200) as words.
    pub async fn fetch_all(
        &self,
        targets: &[Target],
        timeout: Duration,
    ) -> Vec<Result<String, String>> {
        futures_util::future::join_all(targets.iter().map(|t| self.fetch(&t.url, timeout))).await
    }

    /// Every Prometheus server's answer to its query (`(base URL, PromQL)`), in order; see
    /// [`crate::prom_api`].
    pub async fn query_all(
        &self,
        queries: &[(&str, &str)],
        timeout: Duration,
    ) -> Vec<Result<String, String>> {
        futures_util::future::join_all(
            queries
                .iter()
                .map(|(base, promql)| crate::prom_api::fetch(&self.client, base, promql, timeout)),
        )
        .await
    }

    async fn fetch(&self, url: &str, timeout: Duration) -> Result<String, String> {
        let response = self
            .client
            .get(url)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| format!("cannot scrape {url}: {}", with_causes(&e)))?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("{url} answered {status}"));
        }
        crate::body::bounded_text(response, &format!("{url}'s body")).await
    }
}
