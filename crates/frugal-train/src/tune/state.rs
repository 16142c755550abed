//! The tuner's durable state: one SQLite file in the tune directory holding every trial's
//! parameters, status, checkpoint and errors, and every rung result, so a killed or
//! preempted tuner resumes with the scheduler exactly where it was. A lock file keeps a
//! second tuner off the same directory.

use std::fs::File;
use std::path::{Path, PathBuf};

use frugal_cost::Money;
use frugal_cost::durable::{LockError, OpenError, open_versioned};
use rusqlite::{Connection, OptionalExtension, params};

use super::asha::{Asha, AshaConfig, AshaError, Job, Trial, TrialId};
use super::space::Params;

const DB_FILE: &str = "tune.db";
const LOCK_FILE: &str = "tune.lock";
const SCHEMA_VERSION: i64 = 1;
const SCHEMA: &str = "
CREATE TABLE meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);
CREATE TABLE trials (
    id INTEGER PRIMARY KEY,
    params TEXT NOT NULL,
    status TEXT NOT NULL,
    rung INTEGER,
    target INTEGER,
    checkpoint TEXT,
    attempts INTEGER NOT NULL DEFAULT 0,
    last_error TEXT
);
CREATE TABLE results (
    trial INTEGER NOT NULL REFERENCES trials(id),
    rung INTEGER NOT NULL,
    resource INTEGER NOT NULL,
    metric REAL,
    PRIMARY KEY (trial, rung)
);
CREATE TABLE segments (
    trial INTEGER NOT NULL REFERENCES trials(id),
    started_ms INTEGER NOT NULL,
    seconds REAL NOT NULL,
    steps INTEGER NOT NULL,
    cost TEXT NOT NULL,
    outcome TEXT NOT NULL
);
";

/// Why the tuner's state could not be opened or written.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("cannot create the tune directory {}", path.display())]
    CreateDir {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("cannot lock the tune state {}", path.display())]
    Lock {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error(
        "another tuner is running on {}{}; one tuner per state directory",
        dir.display(),
        pid.map(|p| format!(" (process {p})")).unwrap_or_default()
    )]
    Locked { dir: PathBuf, pid: Option<u32> },
    #[error("tune state {}", path.display())]
    Db {
        path: PathBuf,
        #[source]
        source: rusqlite::Error,
    },
    #[error(
        "tune state {} has schema version {found}, newer than this frugal's {SCHEMA_VERSION}",
        path.display()
    )]
    NewerSchema { path: PathBuf, found: i64 },
    #[error(
        "tune state {} belongs to another search (its scheduler settings differ: {stored})",
        path.display()
    )]
    OtherSearch { path: PathBuf, stored: String },
    #[error("tune state {} is inconsistent: {reason}", path.display())]
    Corrupt { path: PathBuf, reason: String },
    #[error("tune state {}", path.display())]
    Schedule {
        path: PathBuf,
        #[source]
        source: AshaError,
    },
}

/// Where a trial stands.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TrialStatus {
    /// A job runs it to its target rung (or waits to be issued again after a restart).
    Running,
    /// Stopped at its last rung; it may still be promoted.
    Stopped,
    /// Reached the last rung.
    Done,
    /// Crashed past its retries; excluded from the search.
    Failed,
}

impl TrialStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            TrialStatus::Running => "running",
            TrialStatus::Stopped => "stopped",
            TrialStatus::Done => "done",
            TrialStatus::Failed => "failed",
        }
    }

    fn parse(s: &str) -> Option<Self> {
        Some(match s {
            "running" => TrialStatus::Running,
            "stopped" => TrialStatus::Stopped,
            "done" => TrialStatus::Done,
            "failed" => TrialStatus::Failed,
            _ => return None,
        })
    }
}

/// One trial as stored, for the summary.
#[derive(Debug, Clone, PartialEq)]
pub struct TrialRecord {
    pub id: TrialId,
    pub params: Params,
    pub status: TrialStatus,
    /// The last rung it reported.
    pub rung: Option<usize>,
    /// The rung its job runs it to, while running.
    pub target: Option<usize>,
    /// `(resource, metric)` at each rung reached, in rung order.
    pub results: Vec<(u64, f64)>,
    pub checkpoint: Option<String>,
    /// Crashed attempts of the job it is on (0 after each rung it reports).
    pub attempts: u32,
    pub last_error: Option<String>,
    /// What its segments used, all together.
    pub work: Work,
}

/// What one or more segments of a trial used.
#[derive(Debug, Clone, Copy, PartialEq, Default)]
pub struct Work {
    pub segments: u32,
    pub seconds: f64,
    /// Steps trained (a resumed segment counts from its checkpoint).
    pub steps: u64,
    pub cost: Money,
}

impl std::ops::AddAssign for Work {
    fn add_assign(&mut self, o: Work) {
        self.segments += o.segments;
        self.seconds += o.seconds;
        self.steps += o.steps;
        self.cost += o.cost;
    }
}

/// The open state of one tune job: the scheduler, mirrored in SQLite before each change
/// takes effect in memory.
#[derive(Debug)]
pub struct TuneState {
    db: Connection,
    path: PathBuf,
    asha: Asha,
    /// flock(2) on the lock file, held while this is open.
    _lock: File,
}

impl TuneState {
    /// Opens (or creates) the state in `dir` for a search with `config`, restoring the
    /// scheduler. Refused while another tuner holds the directory, or when the state
    /// belongs to a search with other settings.
    pub fn open(dir: &Path, config: AshaConfig) -> Result<Self, StateError> {
        std::fs::create_dir_all(dir).map_err(|source| StateError::CreateDir {
            path: dir.to_owned(),
            source,
        })?;
        let lock = lock(dir)?;
        let path = dir.join(DB_FILE);
        let db = open_db(&path)?;
        let db_err = |source| StateError::Db {
            path: path.clone(),
            source,
        };
        // The trial count may grow between runs (to extend a search); the rungs may not.
        let rungs_of = AshaConfig {
            max_trials: None,
            ..config.clone()
        };
        let wanted = serde_json::to_string(&rungs_of).map_err(|e| StateError::Corrupt {
            path: path.clone(),
            reason: e.to_string(),
        })?;
        let stored: Option<String> = db
            .query_row("SELECT value FROM meta WHERE key = 'config'", [], |r| {
                r.get(0)
            })
            .optional()
            .map_err(db_err)?;
        match stored {
            Some(stored) if stored != wanted => {
                return Err(StateError::OtherSearch { path, stored });
            }
            Some(_) => {}
            None => {
                db.execute(
                    "INSERT INTO meta (key, value) VALUES ('config', ?1)",
                    [&wanted],
                )
                .map_err(db_err)?;
            }
        }
        let closed = db
            .query_row("SELECT 1 FROM meta WHERE key = 'closed'", [], |_| Ok(()))
            .optional()
            .map_err(db_err)?
            .is_some();
        let trials = load_trials(&db, &path)?
            .into_iter()
            .map(|r| Trial {
                metrics: r.results.iter().map(|&(_, m)| m).collect(),
                target: r.target,
                running: false,
                failed: r.status == TrialStatus::Failed,
            })
            .collect();
        Ok(Self {
            asha: Asha::restore(config, trials, closed),
            db,
            path,
            _lock: lock,
        })
    }

    /// The scheduler, as restored and kept up to date.
    pub fn asha(&self) -> &Asha {
        &self.asha
    }

    /// Hands out the next job and records it; a new trial is stored with `params(trial)`.
    pub fn next_job(&mut self, params: impl FnOnce(TrialId) -> Params) -> Result<Job, StateError> {
        let job = self.asha.peek_job();
        match job {
            Job::Start { trial, .. } if trial as usize == self.asha.trials().len() => {
                let params =
                    serde_json::to_string(&params(trial)).map_err(|e| StateError::Corrupt {
                        path: self.path.clone(),
                        reason: e.to_string(),
                    })?;
                self.exec(
                    "INSERT INTO trials (id, params, status, target) VALUES (?1, ?2, 'running', 0)",
                    params![trial, params],
                )?;
            }
            Job::Start { trial, .. } | Job::Promote { trial, .. } => {
                let target = job.target().map_or(0, |(_, rung)| rung);
                self.exec(
                    "UPDATE trials SET status = 'running', target = ?2 WHERE id = ?1",
                    params![trial, target as i64],
                )?;
            }
            Job::Wait | Job::Done => {}
        }
        Ok(self.asha.next_job())
    }

    /// A promotion ahead of its turn ([`Asha::speculate`]), recorded as a regular one.
    pub fn speculate(
        &mut self,
        fits: impl Fn(TrialId, usize) -> bool,
    ) -> Result<Option<Job>, StateError> {
        let mut next = self.asha.clone();
        let Some(job) = next.speculate(fits) else {
            return Ok(None);
        };
        let (trial, target) = job.target().unwrap_or_default();
        self.exec(
            "UPDATE trials SET status = 'running', target = ?2 WHERE id = ?1",
            params![trial, target as i64],
        )?;
        self.asha = next;
        Ok(Some(job))
    }

    /// Records `trial`'s `metric` at `rung`.
    pub fn report(&mut self, trial: TrialId, rung: usize, metric: f64) -> Result<(), StateError> {
        // Check against the scheduler before anything is written.
        let mut next = self.asha.clone();
        next.report(trial, rung, metric)
            .map_err(|e| self.schedule_err(e))?;
        let resource = self.asha.rungs()[rung];
        let status = if rung + 1 == self.asha.rungs().len() {
            TrialStatus::Done
        } else {
            TrialStatus::Stopped
        };
        let tx = self.db.transaction().map_err(|source| StateError::Db {
            path: self.path.clone(),
            source,
        })?;
        // SQLite stores NaN as NULL: a diverged trial's metric reads back as NaN.
        let stored = (!metric.is_nan()).then_some(metric);
        tx.execute(
            "INSERT INTO results (trial, rung, resource, metric) VALUES (?1, ?2, ?3, ?4)",
            params![trial, rung as i64, resource as i64, stored],
        )
        .and_then(|_| {
            tx.execute(
                "UPDATE trials SET status = ?2, rung = ?3, target = NULL, attempts = 0
                 WHERE id = ?1",
                params![trial, status.as_str(), rung as i64],
            )
        })
        .and_then(|_| tx.commit())
        .map_err(|source| StateError::Db {
            path: self.path.clone(),
            source,
        })?;
        self.asha = next;
        Ok(())
    }

    /// Records a crashed attempt of `trial` with its error, and issues its job again.
    pub fn retry(&mut self, trial: TrialId, error: &str) -> Result<(), StateError> {
        let mut next = self.asha.clone();
        next.requeue(trial).map_err(|e| self.schedule_err(e))?;
        self.exec(
            "UPDATE trials SET attempts = attempts + 1, last_error = ?2 WHERE id = ?1",
            params![trial, error],
        )?;
        self.asha = next;
        Ok(())
    }

    /// Marks `trial` failed with its error; it leaves the search.
    pub fn fail(&mut self, trial: TrialId, error: &str) -> Result<(), StateError> {
        let mut next = self.asha.clone();
        next.fail(trial).map_err(|e| self.schedule_err(e))?;
        self.exec(
            "UPDATE trials SET status = 'failed', target = NULL, attempts = attempts + 1,
             last_error = ?2 WHERE id = ?1",
            params![trial, error],
        )?;
        self.asha = next;
        Ok(())
    }

    /// Records where `trial`'s newest checkpoint is, for its promotion to resume from.
    pub fn set_checkpoint(&mut self, trial: TrialId, checkpoint: &str) -> Result<(), StateError> {
        let changed = self.exec(
            "UPDATE trials SET checkpoint = ?2 WHERE id = ?1",
            params![trial, checkpoint],
        )?;
        if changed == 0 {
            return Err(self.schedule_err(AshaError::UnknownTrial { trial }));
        }
        Ok(())
    }

    /// Records one segment of `trial` (its time, steps and cost) as it ends.
    pub fn record_segment(
        &mut self,
        trial: TrialId,
        started_ms: i64,
        outcome: &str,
        work: Work,
    ) -> Result<(), StateError> {
        self.exec(
            "INSERT INTO segments (trial, started_ms, seconds, steps, cost, outcome)
             VALUES (?1, ?2, ?3, ?4, ?5, ?6)",
            params![
                trial,
                started_ms,
                work.seconds,
                i64::try_from(work.steps).unwrap_or(i64::MAX),
                work.cost.to_string_places(9),
                outcome
            ],
        )?;
        Ok(())
    }

    /// A consistent copy of the state as `dir/tune.db` (`dir` created), for the store.
    pub fn snapshot(&self, dir: &Path) -> Result<(), StateError> {
        std::fs::create_dir_all(dir).map_err(|source| StateError::CreateDir {
            path: dir.to_owned(),
            source,
        })?;
        let copy = dir.join(DB_FILE);
        let _ = std::fs::remove_file(&copy);
        self.exec("VACUUM INTO ?1", params![copy.to_string_lossy()])?;
        Ok(())
    }

    /// Whether `dir` holds a tuner's state.
    pub fn exists(dir: &Path) -> bool {
        dir.join(DB_FILE).exists()
    }

    /// Puts a snapshot (`from/tune.db`) in place as the state of `dir`.
    pub fn restore(from: &Path, dir: &Path) -> Result<(), StateError> {
        let io = |source| StateError::CreateDir {
            path: dir.to_owned(),
            source,
        };
        std::fs::create_dir_all(dir).map_err(io)?;
        let tmp = dir.join(format!(".{DB_FILE}.restore"));
        std::fs::copy(from.join(DB_FILE), &tmp).map_err(io)?;
        std::fs::rename(&tmp, dir.join(DB_FILE)).map_err(io)
    }

    /// Starts no more trials (a spent budget); running ones go on.
    pub fn close(&mut self) -> Result<(), StateError> {
        self.exec(
            "INSERT OR IGNORE INTO meta (key, value) VALUES ('closed', '1')",
            [],
        )?;
        self.asha.close();
        Ok(())
    }

    /// Every trial, by id.
    pub fn trials(&self) -> Result<Vec<TrialRecord>, StateError> {
        load_trials(&self.db, &self.path)
    }

    fn exec(&self, sql: &str, params: impl rusqlite::Params) -> Result<usize, StateError> {
        self.db
            .execute(sql, params)
            .map_err(|source| StateError::Db {
                path: self.path.clone(),
                source,
            })
    }

    fn schedule_err(&self, source: AshaError) -> StateError {
        StateError::Schedule {
            path: self.path.clone(),
            source,
        }
    }
}

fn load_trials(db: &Connection, path: &Path) -> Result<Vec<TrialRecord>, StateError> {
    let db_err = |source| StateError::Db {
        path: path.to_owned(),
        source,
    };
    let corrupt = |reason: String| StateError::Corrupt {
        path: path.to_owned(),
        reason,
    };
    type Row = (
        u32,
        String,
        String,
        Option<u32>,
        Option<u32>,
        Option<String>,
        u32,
        Option<String>,
    );
    let rows: Vec<Row> = db
        .prepare(
            "SELECT id, params, status, rung, target, checkpoint, attempts, last_error
             FROM trials ORDER BY id",
        )
        .and_then(|mut s| {
            s.query_map([], |r| {
                Ok((
                    r.get(0)?,
                    r.get(1)?,
                    r.get(2)?,
                    r.get(3)?,
                    r.get(4)?,
                    r.get(5)?,
                    r.get(6)?,
                    r.get(7)?,
                ))
            })?
            .collect()
        })
        .map_err(db_err)?;
    let results: Vec<(u32, u32, i64, Option<f64>)> = db
        .prepare("SELECT trial, rung, resource, metric FROM results ORDER BY trial, rung")
        .and_then(|mut s| {
            s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                .collect()
        })
        .map_err(db_err)?;
    let mut work: std::collections::BTreeMap<u32, Work> = std::collections::BTreeMap::new();
    let segments: Vec<(u32, f64, i64, String)> = db
        .prepare("SELECT trial, seconds, steps, cost FROM segments")
        .and_then(|mut s| {
            s.query_map([], |r| Ok((r.get(0)?, r.get(1)?, r.get(2)?, r.get(3)?)))?
                .collect()
        })
        .map_err(db_err)?;
    for (trial, seconds, steps, cost) in segments {
        let cost: Money = cost
            .parse()
            .map_err(|e| corrupt(format!("trial {trial}'s segment cost {cost:?}: {e}")))?;
        *work.entry(trial).or_default() += Work {
            segments: 1,
            seconds,
            steps: u64::try_from(steps).unwrap_or(0),
            cost,
        };
    }
    let mut trials = Vec::with_capacity(rows.len());
    for (expected_id, (id, params, status, rung, target, checkpoint, attempts, last_error)) in
        (0..).zip(rows)
    {
        if id != expected_id {
            return Err(corrupt(format!("trial {expected_id} is missing")));
        }
        let params = serde_json::from_str(&params)
            .map_err(|e| corrupt(format!("trial {id}'s parameters: {e}")))?;
        let status = TrialStatus::parse(&status)
            .ok_or_else(|| corrupt(format!("trial {id} has status {status:?}")))?;
        let results: Vec<(u64, f64)> = results
            .iter()
            .filter(|r| r.0 == id)
            .map(|&(_, _, resource, metric)| (resource as u64, metric.unwrap_or(f64::NAN)))
            .collect();
        let rungs_ok = results.len().checked_sub(1).map(|k| k as u32).eq(&rung);
        if !rungs_ok {
            return Err(corrupt(format!(
                "trial {id} reached rung {rung:?} with {} results",
                results.len()
            )));
        }
        let target = target.map(|k| k as usize);
        let target_ok = match status {
            TrialStatus::Running => target == Some(rung.map_or(0, |k| k as usize + 1)),
            _ => target.is_none(),
        };
        if !target_ok {
            return Err(corrupt(format!(
                "trial {id} is {} toward rung {target:?} from rung {rung:?}",
                status.as_str()
            )));
        }
        trials.push(TrialRecord {
            id,
            params,
            status,
            rung: rung.map(|k| k as usize),
            target,
            results,
            checkpoint,
            attempts,
            last_error,
            work: work.get(&id).copied().unwrap_or_default(),
        });
    }
    Ok(trials)
}

/// Takes the directory's lock file, writing this process's id into it for the message a
/// second tuner gets.
fn lock(dir: &Path) -> Result<File, StateError> {
    let path = dir.join(LOCK_FILE);
    frugal_cost::durable::lock_file(&path).map_err(|e| match e {
        LockError::Locked(pid) => StateError::Locked {
            dir: dir.to_owned(),
            pid,
        },
        LockError::Io(source) => StateError::Lock { path, source },
    })
}

fn open_db(path: &Path) -> Result<Connection, StateError> {
    open_versioned(path, SCHEMA, SCHEMA_VERSION).map_err(|e| match e {
        OpenError::Db(source) => StateError::Db {
            path: path.to_owned(),
            source,
        },
        OpenError::Newer(found) => StateError::NewerSchema {
            path: path.to_owned(),
            found,
        },
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::tune::asha::Mode;
    use crate::tune::space::Value;

    fn config() -> AshaConfig {
        crate::tune::asha::test_config(Mode::Min, Some(16))
    }

    fn params(trial: TrialId) -> Params {
        [("lr".to_owned(), Value::Float(f64::from(trial) / 10.0))]
            .into_iter()
            .collect()
    }

    fn open(dir: &Path) -> TuneState {
        TuneState::open(dir, config()).unwrap_or_else(|e| unreachable!("{e}"))
    }

    /// Hands out `n` jobs, reporting each at once with a metric that depends on the trial.
    fn run(state: &mut TuneState, n: usize) {
        for _ in 0..n {
            let job = state
                .next_job(params)
                .unwrap_or_else(|e| unreachable!("{e}"));
            let Some((trial, rung)) = job.target() else {
                unreachable!("{job:?}")
            };
            let metric = f64::from((trial * 7) % 16) / (rung + 1) as f64;
            state
                .report(trial, rung, metric)
                .unwrap_or_else(|e| unreachable!("{e}"));
        }
    }

    #[test]
    fn reopening_restores_the_scheduler_exactly() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| unreachable!("{e}"));
        let mut state = open(dir.path());
        run(&mut state, 11);
        state
            .set_checkpoint(3, "s3://bucket/tune/3/400")
            .unwrap_or_else(|e| unreachable!("{e}"));
        let before = state.asha().clone();
        let next = before.peek_job();
        drop(state);

        let mut state = open(dir.path());
        assert_eq!(state.asha(), &before);
        assert_eq!(
            state
                .next_job(params)
                .unwrap_or_else(|e| unreachable!("{e}")),
            next
        );
        let trials = state.trials().unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(
            trials[3].checkpoint.as_deref(),
            Some("s3://bucket/tune/3/400")
        );
        assert_eq!(trials[3].params, params(3));
        assert_eq!(trials[3].results.first().map(|r| r.0), Some(100));
    }

    #[test]
    fn a_job_out_when_the_tuner_died_is_issued_again() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| unreachable!("{e}"));
        let mut state = open(dir.path());
        run(&mut state, 4);
        let job = state
            .next_job(params)
            .unwrap_or_else(|e| unreachable!("{e}"));
        assert!(matches!(job, Job::Promote { from_rung: 0, .. }), "{job:?}");
        drop(state);

        let mut state = open(dir.path());
        assert_eq!(
            state
                .next_job(params)
                .unwrap_or_else(|e| unreachable!("{e}")),
            job
        );
        let trials = state.trials().unwrap_or_else(|e| unreachable!("{e}"));
        let (trial, _) = job.target().unwrap_or_default();
        assert_eq!(trials[trial as usize].status, TrialStatus::Running);
    }

    #[test]
    fn a_crash_is_retried_then_failed_with_its_error() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| unreachable!("{e}"));
        let mut state = open(dir.path());
        let job = state
            .next_job(params)
            .unwrap_or_else(|e| unreachable!("{e}"));
        state
            .retry(0, "exit status 1")
            .unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(
            state
                .next_job(params)
                .unwrap_or_else(|e| unreachable!("{e}")),
            job
        );
        state
            .fail(0, "exit status 2")
            .unwrap_or_else(|e| unreachable!("{e}"));
        drop(state);

        let state = open(dir.path());
        let trials = state.trials().unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(trials[0].status, TrialStatus::Failed);
        assert_eq!(trials[0].attempts, 2);
        assert_eq!(trials[0].last_error.as_deref(), Some("exit status 2"));
        assert!(state.asha().trials()[0].failed);
    }

    #[test]
    fn a_diverged_metric_survives_as_nan() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| unreachable!("{e}"));
        let mut state = open(dir.path());
        state
            .next_job(params)
            .unwrap_or_else(|e| unreachable!("{e}"));
        state
            .report(0, 0, f64::NAN)
            .unwrap_or_else(|e| unreachable!("{e}"));
        drop(state);
        let state = open(dir.path());
        assert!(state.asha().trials()[0].metrics[0].is_nan());
    }

    #[test]
    fn a_second_tuner_is_refused_naming_the_holder() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| unreachable!("{e}"));
        let _held = open(dir.path());
        // Another process's id in the lock file: refused at once, naming it.
        std::fs::write(dir.path().join(LOCK_FILE), "1").unwrap_or_else(|e| unreachable!("{e}"));
        let error = TuneState::open(dir.path(), config())
            .map(|_| ())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains("another tuner is running"), "{error}");
        assert!(error.contains("(process 1)"), "{error}");
    }

    #[test]
    fn state_of_another_search_or_a_newer_schema_is_refused() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| unreachable!("{e}"));
        drop(open(dir.path()));
        let mut other = config();
        other.reduction_factor = 3;
        let error = TuneState::open(dir.path(), other)
            .map(|_| ())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains("belongs to another search"), "{error}");

        let db = Connection::open(dir.path().join(DB_FILE)).unwrap_or_else(|e| unreachable!("{e}"));
        db.execute_batch("PRAGMA user_version = 99")
            .unwrap_or_else(|e| unreachable!("{e}"));
        drop(db);
        let error = TuneState::open(dir.path(), config())
            .map(|_| ())
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(error.contains("schema version 99"), "{error}");
    }

    #[test]
    fn a_search_may_grow_its_trial_count_on_resume() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| unreachable!("{e}"));
        let mut small = config();
        small.max_trials = Some(1);
        let mut state = TuneState::open(dir.path(), small).unwrap_or_else(|e| unreachable!("{e}"));
        run(&mut state, 1);
        assert_eq!(
            state
                .next_job(params)
                .unwrap_or_else(|e| unreachable!("{e}")),
            Job::Done
        );
        drop(state);
        let mut state = open(dir.path());
        assert!(matches!(
            state
                .next_job(params)
                .unwrap_or_else(|e| unreachable!("{e}")),
            Job::Start { trial: 1, .. }
        ));
    }

    #[test]
    fn a_report_the_scheduler_does_not_expect_changes_nothing() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| unreachable!("{e}"));
        let mut state = open(dir.path());
        state
            .next_job(params)
            .unwrap_or_else(|e| unreachable!("{e}"));
        assert!(matches!(
            state.report(0, 2, 1.0),
            Err(StateError::Schedule { .. })
        ));
        let trials = state.trials().unwrap_or_else(|e| unreachable!("{e}"));
        assert!(trials[0].results.is_empty());
    }
}
