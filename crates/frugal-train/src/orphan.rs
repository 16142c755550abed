//! A segment whose supervisor is killed (`kill -9`, the OOM killer) is never billed by it,
//! and its command may run on unwatched. A marker file, written when the segment starts and
//! removed once it is billed, lets the next start find such a segment: its command is
//! stopped if it still runs (two commands on one checkpoint directory would corrupt it),
//! and the segment is billed, as failed, up to its command's end.

use std::path::Path;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use frugal_cloud::store::local_checkpoints;
use frugal_cost::event::Outcome;

use crate::contract;
use crate::supervisor::Segment;

/// Marks a segment as running: `pid started_ms resumed_from` (-1 for none), where
/// `started_ms` is `since`, the start the supervisor bills it from: billed from the marker
/// too, the segment has the same start, so the same ledger id, and is stored once.
pub fn mark(marker: &Path, pid: u32, resumed_from: Option<u64>, since: SystemTime) {
    let since_ms = since
        .duration_since(UNIX_EPOCH)
        .unwrap_or_default()
        .as_millis();
    let resumed = resumed_from.map_or(-1, i128::from);
    if let Err(e) = std::fs::write(marker, format!("{pid} {since_ms} {resumed}")) {
        tracing::warn!("cannot write {}: {e}", marker.display());
    }
}

/// The segment is billed: its marker goes.
pub fn clear(marker: &Path) {
    let _ = std::fs::remove_file(marker);
}

/// Marks each segment as running at its path until it is billed (then [`clear`]ed).
pub struct Marking(pub std::path::PathBuf);

impl crate::supervisor::Observer for Marking {
    fn started(&mut self, _attempt: u32, pid: u32, resumed_from: Option<u64>, since: SystemTime) {
        mark(&self.0, pid, resumed_from, since);
    }
}

/// Where a run's files are, to settle a segment it left.
pub struct Run<'a> {
    pub id: &'a str,
    pub metrics: &'a Path,
    pub checkpoint_dir: &'a Path,
    /// The command's log, if it has one of its own.
    pub log: Option<&'a Path>,
}

/// The segment a killed supervisor left unbilled, if its marker stands; its command, if
/// still running (checked to be this run's: its environment names the run), is killed
/// first. The caller bills it, then [`clear`]s the marker.
pub fn settle(marker: &Path, run: &Run<'_>) -> Option<Segment> {
    let text = std::fs::read_to_string(marker).ok()?;
    let mut fields = text.split_whitespace().map(str::parse::<i64>);
    let (Some(Ok(pid)), Some(Ok(started_ms))) = (fields.next(), fields.next()) else {
        clear(marker);
        return None;
    };
    let resumed_from = fields
        .next()
        .and_then(Result::ok)
        .and_then(|s| u64::try_from(s).ok());
    let pid = i32::try_from(pid).unwrap_or(0);
    let mark = format!("{}={}\0", contract::RUN_ID, run.id);
    let alive = pid > 0
        && std::fs::read(format!("/proc/{pid}/environ"))
            .is_ok_and(|env| env.windows(mark.len()).any(|w| w == mark.as_bytes()));
    let ended = if alive {
        tracing::warn!(
            "run {}: its command (process {pid}) outlived its supervisor: stopping it",
            run.id
        );
        let _ = nix::sys::signal::killpg(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        );
        let until = Instant::now() + Duration::from_secs(10);
        while Path::new(&format!("/proc/{pid}")).exists() && Instant::now() < until {
            std::thread::sleep(Duration::from_millis(20));
        }
        SystemTime::now()
    } else {
        // It died with its supervisor, or since: its last word is when it ended.
        [Some(run.metrics), run.log]
            .into_iter()
            .flatten()
            .filter_map(|p| std::fs::metadata(p).and_then(|m| m.modified()).ok())
            .max()
            .unwrap_or_else(SystemTime::now)
    };
    let started = UNIX_EPOCH + Duration::from_millis(u64::try_from(started_ms).unwrap_or(0));
    let ended = ended.max(started);
    let last_step = std::fs::read_to_string(run.metrics)
        .unwrap_or_default()
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v["step"].as_u64())
        .next_back();
    let newest = local_checkpoints(run.checkpoint_dir)
        .unwrap_or_default()
        .last()
        .and_then(|(_, path)| std::fs::metadata(path).and_then(|m| m.modified()).ok());
    let segment = Segment {
        attempt: 1,
        started,
        ended,
        outcome: Outcome::Failed,
        cause: "its supervisor was killed".into(),
        resumed_from,
        last_checkpoint: None,
        first_step: last_step.filter(|&s| Some(s) > resumed_from),
        last_step,
        // The work since its newest checkpoint is done again.
        lost: ended
            .duration_since(newest.unwrap_or(started).max(started))
            .unwrap_or_default(),
        utilization: None,
        diagnoses: Vec::new(),
        mfu: None,
        precision: None,
        data_stall: None,
        sync_stall: None,
    };
    tracing::info!(
        "run {}: billing the segment its killed supervisor left ({:.1} s)",
        run.id,
        segment.duration().as_secs_f64()
    );
    Some(segment)
}
