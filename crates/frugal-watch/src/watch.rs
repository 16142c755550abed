//! One pass of `frugal watch` over its targets: each target's `/metrics` fetched, read,
//! and differenced against its previous snapshot into billed events. The snapshots are
//! kept in a state file, so `frugal watch --once` from cron bills the time between runs,
//! and a restart of the watcher loses nothing.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use frugal_cost::Event;
use frugal_cost::money::{HourlyRate, Millis};
use serde::{Deserialize, Serialize};

use crate::expo::parse;
use crate::interval::{Interval, Snapshot, TargetMeta, events};
use crate::reading::{Kind, Reading, detect};

/// A server to watch, as configured.
#[derive(Debug, Clone)]
pub struct Target {
    pub meta: TargetMeta,
    pub url: String,
    /// `None`: detected from the metric names.
    pub kind: Option<Kind>,
    /// What its machine costs an hour.
    pub rate: HourlyRate,
}

/// What one target's scrape came to.
#[derive(Debug, Clone)]
pub enum Outcome {
    /// The first reading: nothing to difference yet.
    Baseline(Reading),
    /// The work since the previous reading, and its events.
    Billed {
        interval: Interval,
        events: Vec<Event>,
    },
    /// No bill for this interval, and why (the next reading starts afresh).
    Gap(String),
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

    /// Reads `body` (or the fetch's error) for `target` at `at_ms`, against its last
    /// snapshot. A failed or unreadable scrape is a gap and forgets the last snapshot, so
    /// the time it covered is never billed as busy or idle.
    pub fn observe(
        &mut self,
        target: &Target,
        body: Result<String, String>,
        at_ms: Millis,
    ) -> Outcome {
        let name = &target.meta.name;
        let reading = body.and_then(|text| {
            let scrape = parse(&text).map_err(|e| e.to_string())?;
            let kind = match target.kind {
                Some(k) => k,
                None => detect(&scrape)
                    .ok_or("no vLLM, TGI, llama.cpp, frugal or DCGM metrics in the body")?,
            };
            Ok(Reading::new(kind, &scrape))
        });
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
                Ok(interval) => match events(&target.meta, target.rate, prev.at_ms, &interval) {
                    Ok(events) => Outcome::Billed { interval, events },
                    Err(e) => Outcome::Gap(e.to_string()),
                },
                Err(gap) => Outcome::Gap(gap.to_string()),
            },
        };
        self.last.insert(name.clone(), next);
        outcome
    }
}

/// Scrapes targets' `/metrics` over one HTTP client.
#[derive(Debug, Default)]
pub struct Scraper {
    client: reqwest::Client,
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

    async fn fetch(&self, url: &str, timeout: Duration) -> Result<String, String> {
        let response = self
            .client
            .get(url)
            .timeout(timeout)
            .send()
            .await
            .map_err(|e| format!("cannot scrape {url}: {e}"))?;
        let status = response.status();
        if !status.is_success() {
            return Err(format!("{url} answered {status}"));
        }
        response
            .text()
            .await
            .map_err(|e| format!("cannot read {url}'s body: {e}"))
    }
}
