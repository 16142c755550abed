//! A batch job on a machine that can be taken away (`frugal batch run`): a stop signal or a
//! spot notice stops taking lines and lets those in flight finish until the deadline; the
//! job's state is copied to an object store every so often and at the end, and a machine
//! that finds no state of its own brings the newest copy back and goes on from there.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use axum::Router;
use frugal_cloud::notice::AnySource;
use frugal_cloud::store::{CheckpointStore, StoreError as CopyError};
use frugal_cloud::watch::NoticeWatcher;
use frugal_cost::causes::with_causes;

use super::input::Input;
use super::run::{Ended, Progress, RunConfig, run};
use super::store::{Options, Paths, Store, StoreError, restore_snapshot};

/// Time kept back from a spot notice's deadline to copy the state to the store.
pub const UPLOAD_MARGIN: Duration = Duration::from_secs(15);
/// Snapshots kept in the store.
const KEEP: usize = 2;

/// What went wrong moving a job's state to or from its store, or running it.
#[derive(Debug, thiserror::Error)]
pub enum SpotError {
    #[error("cannot open the store {url}")]
    Open {
        url: String,
        #[source]
        source: Box<CopyError>,
    },
    #[error("cannot restore the job from {store}")]
    Restore {
        store: String,
        #[source]
        source: Box<CopyError>,
    },
    #[error("cannot copy the batch state to {store}")]
    Copy {
        store: String,
        #[source]
        source: Box<CopyError>,
    },
    #[error("cannot create {}", path.display())]
    Scratch {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("the snapshot's thread stopped")]
    Snapshot(#[source] tokio::task::JoinError),
    #[error(transparent)]
    State(#[from] StoreError),
}

/// The store at `url` where the job of `input` keeps its copies: the same input finds them
/// again from any machine.
pub fn open_copies(url: &str, input: &Input) -> Result<CheckpointStore, SpotError> {
    CheckpointStore::open(url, &format!("batch-{}", &input.sha256[..16])).map_err(|source| {
        SpotError::Open {
            url: url.to_owned(),
            source: Box::new(source),
        }
    })
}

/// Brings the newest copy of the job from `copies` into `paths`: how many lines it had
/// finished, or `None` when the store holds none.
pub async fn restore(copies: &CheckpointStore, paths: &Paths) -> Result<Option<u64>, SpotError> {
    let scratch = scratch_dir(paths, "restore")?;
    let found = copies
        .restore_newest(&scratch)
        .await
        .map_err(|source| SpotError::Restore {
            store: copies.describe(),
            source: Box::new(source),
        })?;
    let Some((manifest, dir)) = found else {
        return Ok(None);
    };
    restore_snapshot(&dir, paths)?;
    let _ = std::fs::remove_dir_all(&scratch);
    Ok(Some(manifest.step))
}

/// The job's durable state in `paths`, brought first from the newest copy in `copies` when
/// this machine has none (the job moved here); with the lines the copy had finished when it
/// was one.
pub async fn open_job(
    paths: &Paths,
    input_path: &Path,
    input: &Input,
    copies: Option<&CheckpointStore>,
    mut options: Options,
) -> Result<(Store, Option<u64>), SpotError> {
    let moved = match copies {
        Some(c) if !paths.state.join("batch.sqlite").exists() => restore(c, paths).await?,
        _ => None,
    };
    options.relocate |= moved.is_some();
    Ok((Store::open(paths, input_path, input, &options)?, moved))
}

/// A folder beside the job's state for snapshots on their way to or from the store.
fn scratch_dir(paths: &Paths, what: &str) -> Result<PathBuf, SpotError> {
    let mut name = paths.state.as_os_str().to_owned();
    name.push(format!(".{what}"));
    let dir = PathBuf::from(name);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).map_err(|source| SpotError::Scratch {
        path: dir.clone(),
        source,
    })?;
    Ok(dir)
}

/// What stops a job besides its end.
#[derive(Debug)]
pub struct Stops {
    /// The cloud's preemption notices, polled every `poll`.
    pub notices: Option<AnySource>,
    pub poll: Duration,
    /// How long lines in flight may finish after a stop signal.
    pub grace: Duration,
    /// How often the state is copied to the store while lines finish.
    pub copy_every: Duration,
}

/// How a run of a job ended.
#[derive(Debug)]
pub struct Outcome {
    pub ended: Ended,
    /// What stopped it: "a stop signal", "a aws preemption notice, 90 s left".
    pub why: Option<String>,
    /// The last copy to the store failed: only a move to another machine needs it, the
    /// job's state is whole in its folder.
    pub copy_failed: Option<SpotError>,
}

/// The job under way, and where its state is copied.
pub struct Job<'a> {
    pub paths: &'a Paths,
    pub store: Arc<Store>,
    pub input: &'a Input,
    pub config: &'a RunConfig,
    pub progress: Arc<Progress>,
    pub copies: Option<&'a CheckpointStore>,
}

impl Job<'_> {
    /// Runs the lines through `app` until done or stopped, copying the state to the store
    /// every `stops.copy_every` and at the end; says how it ended, and why it stopped.
    pub async fn run(&self, app: Router, stops: Stops) -> Result<Outcome, SpotError> {
        let watcher = stops
            .notices
            .map(|source| NoticeWatcher::spawn(source, stops.poll));
        let (stop_tx, stop_rx) = tokio::sync::watch::channel(None::<(String, Duration)>);
        let watch = async move {
            let notice = async {
                match &watcher {
                    Some(w) => w.first().await,
                    None => std::future::pending().await,
                }
            };
            let (why, left) = tokio::select! {
                () = crate::server::shutdown_signal() => ("a stop signal".to_owned(), stops.grace),
                notice = notice => {
                    let left = notice.time_left().saturating_sub(UPLOAD_MARGIN);
                    (format!("a {} preemption notice, {} s left", notice.cloud, notice.time_left().as_secs()), left)
                }
            };
            let _ = stop_tx.send(Some((why, left)));
            std::future::pending::<()>().await;
        };
        let mut stopped = stop_rx.clone();
        let stop = async move {
            let _ = stopped.wait_for(Option::is_some).await;
        };
        let mut abandoned = stop_rx.clone();
        let deadline = async move {
            let left = match abandoned.wait_for(Option::is_some).await {
                Ok(v) => v.as_ref().map_or(Duration::ZERO, |(_, left)| *left),
                Err(_) => return std::future::pending().await,
            };
            tokio::time::sleep(left).await;
        };
        let lines = run(
            app,
            self.store.clone(),
            self.input,
            self.config,
            self.progress.clone(),
            stop,
        );
        let ended = tokio::select! {
            r = lines => r?,
            // Lines still in flight at the deadline stay pending: they run again next time.
            () = deadline => Ended::Stopped,
            () = watch => unreachable!("the watch never ends"),
            () = self.copy_every(stops.copy_every) => unreachable!("the copier never ends"),
        };
        let why = stop_rx.borrow().as_ref().map(|(why, _)| why.clone());
        Ok(Outcome {
            ended,
            why,
            copy_failed: self.copy().await.err(),
        })
    }

    /// Copies the state to the store each `every` while lines finish; a failed copy is
    /// said and tried again next time (the job goes on: only a move needs the copy).
    async fn copy_every(&self, every: Duration) {
        if self.copies.is_none() {
            return std::future::pending().await;
        }
        let mut last = 0;
        loop {
            tokio::time::sleep(every.max(Duration::from_secs(1))).await;
            let finished = self.finished();
            if finished == last {
                continue;
            }
            match self.copy().await {
                Ok(()) => last = finished,
                Err(e) => tracing::warn!(
                    "the batch state was not copied to the store: {}",
                    with_causes(&e)
                ),
            }
        }
    }

    fn finished(&self) -> usize {
        self.store.counts().map_or(0, |c| c.completed + c.failed)
    }

    /// Copies the state as it stands to the store, under the number of lines finished.
    async fn copy(&self) -> Result<(), SpotError> {
        let Some(copies) = self.copies else {
            return Ok(());
        };
        let dir = scratch_dir(self.paths, "snapshot")?;
        let store = self.store.clone();
        let snap = dir.clone();
        tokio::task::spawn_blocking(move || store.snapshot(&snap))
            .await
            .map_err(SpotError::Snapshot)??;
        copies
            .upload(self.finished() as u64, &dir)
            .await
            .map_err(|source| SpotError::Copy {
                store: copies.describe(),
                source: Box::new(source),
            })?;
        if let Err(e) = copies.prune(KEEP).await {
            tracing::warn!("old copies of the batch state were not removed: {e}");
        }
        let _ = std::fs::remove_dir_all(&dir);
        Ok(())
    }
}
