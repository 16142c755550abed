//! The store's tests: exactly once through crashes, torn lines, locks and full disks.

#![allow(clippy::unwrap_used)]

use std::collections::HashSet;
use std::sync::Arc;

use super::*;
use crate::batch::input::{self, Limits};

struct Fixture {
    dir: tempfile::TempDir,
    input: Input,
}

impl Fixture {
    fn new(lines: usize) -> Fixture {
        let dir = tempfile::tempdir().unwrap();
        let input = input_of(lines, "hi");
        Fixture { dir, input }
    }

    fn paths(&self) -> Paths {
        Paths::beside(&self.dir.path().join("out.jsonl"))
    }

    fn open(&self) -> Result<Store, StoreError> {
        self.open_with(&self.paths(), &Options::default())
    }

    fn open_with(&self, paths: &Paths, options: &Options) -> Result<Store, StoreError> {
        Store::open(
            paths,
            &self.dir.path().join("in.jsonl"),
            &self.input,
            options,
        )
    }

    /// Sets a line's row back to pending, as a crash between the append and the
    /// commit leaves it.
    fn uncommit(&self, custom_id: &str) {
        let db = Connection::open(self.paths().state.join(DB_FILE)).unwrap();
        let n = db
            .execute(
                "UPDATE lines SET status = 'pending' WHERE custom_id = ?1",
                [custom_id],
            )
            .unwrap();
        assert_eq!(n, 1);
    }
}

fn input_of(lines: usize, prompt: &str) -> Input {
    let text: String = (0..lines)
        .map(|i| {
            format!(
                r#"{{"custom_id": "r{i}", "method": "POST", "url": "/v1/completions", "body": {{"prompt": "{prompt}"}}}}"#
            ) + "\n"
        })
        .collect();
    input::parse(text.as_bytes(), &Limits::default()).unwrap()
}

fn ok(n: u64) -> Response {
    Response {
        status_code: 200,
        request_id: format!("req-{n}"),
        body: serde_json::json!({"choices": [{"text": n.to_string()}]}),
    }
}

/// The custom_ids of a results file, each line checked to be whole JSON.
fn ids(path: &Path) -> Vec<String> {
    let text = std::fs::read_to_string(path).unwrap_or_default();
    assert!(text.is_empty() || text.ends_with('\n'), "{text:?}");
    text.lines()
        .map(|l| {
            let v: Value = serde_json::from_str(l).unwrap();
            v["custom_id"].as_str().unwrap().to_owned()
        })
        .collect()
}

fn pending_ids(store: &Store) -> Vec<String> {
    store
        .pending()
        .unwrap()
        .into_iter()
        .map(|p| p.custom_id)
        .collect()
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

#[test]
fn results_go_to_the_output_and_error_files_in_openai_format() {
    let f = Fixture::new(4);
    let store = f.open().unwrap();
    assert_eq!(pending_ids(&store), ["r0", "r1", "r2", "r3"]);
    store.record_done("r1", &ok(1)).unwrap();
    let refused = Response {
        status_code: 400,
        request_id: "req-2".into(),
        body: serde_json::json!({"error": {"message": "no"}}),
    };
    store
        .record_failed("r2", &Failure::Response(refused))
        .unwrap();
    let expired = LineError {
        code: "batch_expired".into(),
        message: "This request could not be executed before the completion window expired.".into(),
    };
    store
        .record_failed("r3", &Failure::Error(expired.clone()))
        .unwrap();
    assert_eq!(pending_ids(&store), ["r0"]);
    assert_eq!(
        store.counts().unwrap(),
        RequestCounts {
            total: 4,
            completed: 1,
            failed: 2
        }
    );

    let paths = f.paths();
    let out: Value =
        serde_json::from_str(std::fs::read_to_string(&paths.output).unwrap().trim()).unwrap();
    let id = out["id"].as_str().unwrap();
    assert!(id.starts_with("batch_req_") && id.len() == 34, "{id}");
    assert_eq!(
        out,
        serde_json::json!({"id": id, "custom_id": "r1", "error": null, "response": {
            "status_code": 200, "request_id": "req-1",
            "body": {"choices": [{"text": "1"}]}
        }})
    );
    let errors: Vec<Value> = std::fs::read_to_string(&paths.errors)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(errors[0]["response"]["status_code"], 400);
    assert_eq!(errors[0]["error"], Value::Null);
    assert_eq!(errors[1]["response"], Value::Null);
    assert_eq!(errors[1]["error"]["code"], "batch_expired");
    assert_eq!(errors[1]["custom_id"], "r3");
}

#[test]
fn a_line_is_recorded_once() {
    let f = Fixture::new(2);
    let store = f.open().unwrap();
    store.record_done("r0", &ok(0)).unwrap();
    let again = store.record_done("r0", &ok(0)).unwrap_err();
    assert!(
        matches!(again, StoreError::AlreadyRecorded { status: "done", .. }),
        "{again}"
    );
    let failure = Failure::Error(LineError {
        code: "x".into(),
        message: "y".into(),
    });
    assert!(store.record_failed("r0", &failure).is_err());
    assert!(store.record_attempt("r0", "late").is_err());
    assert!(matches!(
        store.record_done("nope", &ok(0)),
        Err(StoreError::UnknownLine(_))
    ));
    assert_eq!(ids(&f.paths().output), ["r0"]);
}

#[test]
fn a_kill_between_append_and_commit_leaves_no_duplicate() {
    let f = Fixture::new(4);
    {
        let store = f.open().unwrap();
        store.record_done("r0", &ok(0)).unwrap();
        store.record_done("r1", &ok(1)).unwrap();
        let e = Failure::Error(LineError {
            code: "c".into(),
            message: "m".into(),
        });
        store.record_failed("r2", &e).unwrap();
    }
    f.uncommit("r1");
    f.uncommit("r2");
    let store = f.open().unwrap();
    assert_eq!(pending_ids(&store), ["r3"]);
    assert_eq!(
        store.counts().unwrap(),
        RequestCounts {
            total: 4,
            completed: 2,
            failed: 1
        }
    );
    assert!(store.record_done("r1", &ok(1)).is_err());
    store.record_done("r3", &ok(3)).unwrap();
    drop(store);
    assert_eq!(ids(&f.paths().output), ["r0", "r1", "r3"]);
    assert_eq!(ids(&f.paths().errors), ["r2"]);
    // The reconciled rows were committed: the database alone agrees now.
    let db = Connection::open(f.paths().state.join(DB_FILE)).unwrap();
    let pending: i64 = db
        .query_row(
            "SELECT count(*) FROM lines WHERE status = 'pending'",
            [],
            |r| r.get(0),
        )
        .unwrap();
    assert_eq!(pending, 0);
}

#[test]
fn a_torn_last_line_is_cut_off_and_its_line_reruns() {
    let f = Fixture::new(3);
    let paths = f.paths();
    {
        let store = f.open().unwrap();
        store.record_done("r0", &ok(0)).unwrap();
    }
    let whole = std::fs::read(&paths.output).unwrap();
    let mut out = OpenOptions::new().append(true).open(&paths.output).unwrap();
    out.write_all(br#"{"id": "batch_req_1", "custom_id": "r1", "respo"#)
        .unwrap();
    // A whole-looking last line that is not JSON is cut off too, in the error file.
    std::fs::write(&paths.errors, b"\0\0\0\0\n").unwrap();
    let store = f.open().unwrap();
    assert_eq!(std::fs::read(&paths.output).unwrap(), whole);
    assert_eq!(std::fs::read(&paths.errors).unwrap(), b"");
    assert_eq!(pending_ids(&store), ["r1", "r2"]);
    store.record_done("r1", &ok(1)).unwrap();
    store.record_done("r2", &ok(2)).unwrap();
    drop(store);
    assert_eq!(ids(&paths.output), ["r0", "r1", "r2"]);
    let store = f.open().unwrap();
    assert!(pending_ids(&store).is_empty());
    assert_eq!(store.counts().unwrap().completed, 3);
}

#[test]
fn a_torn_line_in_the_error_file_is_cut_off() {
    let f = Fixture::new(2);
    let paths = f.paths();
    drop(f.open().unwrap());
    std::fs::write(&paths.errors, br#"{"id": "x", "custom_id": "r0""#).unwrap();
    let store = f.open().unwrap();
    assert_eq!(std::fs::read(&paths.errors).unwrap(), b"");
    assert_eq!(pending_ids(&store), ["r0", "r1"]);
}

#[test]
fn a_line_the_files_lost_runs_again() {
    let f = Fixture::new(2);
    {
        let store = f.open().unwrap();
        store.record_done("r0", &ok(0)).unwrap();
    }
    std::fs::write(f.paths().output, b"").unwrap();
    let store = f.open().unwrap();
    assert_eq!(pending_ids(&store), ["r0", "r1"]);
}

#[test]
fn an_unreadable_line_before_others_is_refused() {
    let f = Fixture::new(3);
    {
        let store = f.open().unwrap();
        store.record_done("r0", &ok(0)).unwrap();
    }
    let output = f.paths().output;
    let mut text = b"garbage\n".to_vec();
    text.extend(std::fs::read(&output).unwrap());
    std::fs::write(&output, &text).unwrap();
    let err = f.open().err().unwrap();
    assert!(matches!(err, StoreError::Corrupt { line: 1, .. }), "{err}");
    // Refused, not repaired: the file is as it was.
    assert_eq!(std::fs::read(&output).unwrap(), text);
}

#[test]
fn a_custom_id_not_in_the_input_is_refused() {
    let f = Fixture::new(2);
    drop(f.open().unwrap());
    std::fs::write(f.paths().output, "{\"custom_id\": \"zz\"}\n").unwrap();
    let err = f.open().err().unwrap();
    assert!(
        err.to_string().contains("`zz` is not in this batch"),
        "{err}"
    );
}

#[test]
fn a_second_open_of_a_running_job_is_refused() {
    let f = Fixture::new(1);
    let first = f.open().unwrap();
    // flock(2) locks belong to an open file description: a second open in the same
    // process conflicts as another process's would.
    let err = f.open().err().unwrap();
    let StoreError::Locked { pid, .. } = &err else {
        panic!("{err}");
    };
    assert_eq!(*pid, Some(std::process::id()));
    assert!(err.to_string().contains("is already running"), "{err}");
    drop(first);
    assert!(f.open().is_ok());
}

#[test]
fn a_state_for_another_input_is_refused() {
    let f = Fixture::new(2);
    drop(f.open().unwrap());
    let other = input_of(2, "bye");
    let err = Store::open(&f.paths(), Path::new("x"), &other, &Options::default())
        .err()
        .unwrap();
    assert!(matches!(err, StoreError::DifferentInput { .. }), "{err}");
    assert!(err.to_string().contains(&other.sha256), "{err}");
}

#[test]
fn a_state_for_other_files_is_refused() {
    let f = Fixture::new(2);
    drop(f.open().unwrap());
    let mut paths = f.paths();
    paths.output = f.dir.path().join("elsewhere.jsonl");
    let err = f.open_with(&paths, &Options::default()).err().unwrap();
    assert!(
        matches!(err, StoreError::DifferentPath { what: "output", .. }),
        "{err}"
    );
}

#[test]
fn an_output_with_results_but_no_state_is_refused() {
    let f = Fixture::new(2);
    std::fs::write(f.paths().output, "{\"custom_id\": \"r0\"}\n").unwrap();
    let err = f.open().err().unwrap();
    assert!(
        matches!(err, StoreError::NotOurs { what: "output", .. }),
        "{err}"
    );
}

#[test]
fn an_unwritable_output_is_refused_before_anything_runs() {
    let f = Fixture::new(2);
    let missing = f.dir.path().join("no-such-dir");
    let paths = Paths::beside(&missing.join("out.jsonl"));
    let err = f.open_with(&paths, &Options::default()).err().unwrap();
    assert!(
        err.to_string().starts_with(&format!(
            "the output {} is not writable",
            paths.output.display()
        )),
        "{err}"
    );
    assert!(!missing.exists(), "the state directory made the output's");
    // A directory where the output should be.
    let paths = Paths {
        output: f.dir.path().to_owned(),
        ..f.paths()
    };
    let err = f.open_with(&paths, &Options::default()).err().unwrap();
    assert!(matches!(err, StoreError::Unwritable { .. }), "{err}");
    assert!(!paths.state.exists(), "nothing was made for a refused job");
}

#[test]
fn a_full_disk_is_refused_at_open() {
    let f = Fixture::new(1);
    let options = Options {
        min_free_bytes: u64::MAX,
        ..Options::default()
    };
    let err = f.open_with(&f.paths(), &options).err().unwrap();
    assert!(matches!(err, StoreError::DiskFull { .. }), "{err}");
    assert!(err.to_string().contains("is full"), "{err}");
}

#[test]
fn a_failed_write_leaves_the_line_pending_and_the_file_whole() {
    let f = Fixture::new(3);
    let store = f.open().unwrap();
    store.record_done("r0", &ok(0)).unwrap();
    store.state.lock().unwrap().output.fail_after = Some(10);
    let err = store.record_done("r1", &ok(1)).unwrap_err();
    assert!(matches!(err, StoreError::Write { .. }), "{err}");
    assert!(err.to_string().contains("the disk is full"), "{err}");
    assert_eq!(ids(&f.paths().output), ["r0"]);
    assert_eq!(pending_ids(&store), ["r1", "r2"]);
    store.record_done("r1", &ok(1)).unwrap();
    drop(store);
    assert_eq!(ids(&f.paths().output), ["r0", "r1"]);
    assert_eq!(pending_ids(&f.open().unwrap()), ["r2"]);
}

#[test]
fn concurrent_writers_write_each_line_once() {
    let f = Fixture::new(400);
    let store = Arc::new(f.open().unwrap());
    let workers: Vec<_> = (0..8)
        .map(|w| {
            let store = store.clone();
            std::thread::spawn(move || {
                // Every worker tries every line; one write of each may win.
                let mut wins = 0;
                for i in 0..400u64 {
                    let id = format!("r{}", (i + w * 50) % 400);
                    if store.record_done(&id, &ok(i)).is_ok() {
                        wins += 1;
                    }
                }
                wins
            })
        })
        .collect();
    let wins: usize = workers.into_iter().map(|w| w.join().unwrap()).sum();
    assert_eq!(wins, 400);
    let got = ids(&f.paths().output);
    let want: Vec<String> = (0..400).map(|i| format!("r{i}")).collect();
    assert_eq!(sorted(got), sorted(want));
    assert_eq!(store.counts().unwrap().completed, 400);
}

#[test]
fn attempts_and_status_survive_a_restart() {
    let f = Fixture::new(2);
    let created = {
        let store = f.open().unwrap();
        assert_eq!(store.record_attempt("r1", "HTTP 503").unwrap(), 1);
        assert_eq!(store.record_attempt("r1", "HTTP 429").unwrap(), 2);
        assert_eq!(store.status().unwrap(), JobStatus::InProgress);
        store.set_status(JobStatus::Finalizing).unwrap();
        store.job().clone()
    };
    assert_eq!(
        created.expires_at(),
        created.created_at + 24 * 60 * 60,
        "{created:?}"
    );
    let store = f
        .open_with(
            &f.paths(),
            &Options {
                completion_window: Duration::from_secs(5),
                ..Options::default()
            },
        )
        .unwrap();
    assert_eq!(store.job(), &created, "a resumed job keeps its own window");
    assert_eq!(store.status().unwrap(), JobStatus::Finalizing);
    let pending = store.pending().unwrap();
    assert_eq!(
        (
            pending[1].custom_id.as_str(),
            pending[1].number,
            pending[1].attempts
        ),
        ("r1", 2, 2)
    );
    assert_eq!(pending[0].attempts, 0);
}

#[test]
fn output_ids_are_stable_for_a_job_and_line() {
    let f = Fixture::new(1);
    let store = f.open().unwrap();
    assert_eq!(store.request_id("r0"), store.request_id("r0"));
    assert_ne!(store.request_id("r0"), store.request_id("r1"));
}

#[test]
fn paths_sit_beside_the_output() {
    let p = Paths::beside(Path::new("/d/out.jsonl"));
    assert_eq!(p.state, Path::new("/d/out.jsonl.frugal-batch"));
    assert_eq!(p.errors, Path::new("/d/out.errors.jsonl"));
    assert_eq!(
        Paths::beside(Path::new("res")).errors,
        Path::new("res.errors")
    );
    let f = Fixture::new(1);
    let mut paths = f.paths();
    paths.errors = paths.output.clone();
    assert!(matches!(
        f.open_with(&paths, &Options::default()),
        Err(StoreError::SamePath(_))
    ));
}

/// Where [`writer_process`] writes; set only in the child processes the kill test starts.
const WRITER_DIR: &str = "FRUGAL_TEST_BATCH_WRITER_DIR";
const KILLED_LINES: usize = 300;

/// The writer that `a_job_killed_at_random_moments_writes_each_line_once` runs in a child
/// process and kills; not a test of its own.
#[test]
#[ignore = "a child process of a_job_killed_at_random_moments_writes_each_line_once"]
fn writer_process() {
    let Some(dir) = std::env::var_os(WRITER_DIR) else {
        return;
    };
    let dir = PathBuf::from(dir);
    let paths = Paths::beside(&dir.join("out.jsonl"));
    let input = input_of(KILLED_LINES, "hi");
    let store = Store::open(&paths, &dir.join("in.jsonl"), &input, &Options::default()).unwrap();
    for (i, p) in store.pending().unwrap().into_iter().enumerate() {
        if i % 7 == 3 {
            store.record_attempt(&p.custom_id, "HTTP 503").unwrap();
        }
        store
            .record_done(&p.custom_id, &ok(p.number as u64))
            .unwrap();
        // A line takes a moment, as a real request does: on a fast disk the whole job
        // would otherwise be written before the parent's kill comes.
        std::thread::sleep(Duration::from_millis(2));
    }
}

/// The custom_ids of the whole lines of a results file, torn tail aside.
fn whole_ids(path: &Path) -> Vec<String> {
    let text = std::fs::read(path).unwrap_or_default();
    let end = text.iter().rposition(|b| *b == b'\n').map_or(0, |i| i + 1);
    text[..end]
        .split(|b| *b == b'\n')
        .filter(|l| !l.is_empty())
        .map(|l| serde_json::from_slice::<Recorded>(l).unwrap().custom_id)
        .collect()
}

#[test]
fn a_job_killed_at_random_moments_writes_each_line_once() {
    let dir = tempfile::tempdir().unwrap();
    let output = dir.path().join("out.jsonl");
    let writer = || {
        std::process::Command::new(std::env::current_exe().unwrap())
            .args([
                "--ignored",
                "--exact",
                "batch::store::tests::writer_process",
            ])
            .env(WRITER_DIR, dir.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap()
    };
    let mut kills = 0;
    for _ in 0..5 {
        let mut child = writer();
        let delay = 20 + getrandom::u64().unwrap() % 150;
        std::thread::sleep(Duration::from_millis(delay));
        if child.try_wait().unwrap().is_none() {
            kills += 1;
        }
        // SIGKILL: no destructor runs, the lock goes with the process.
        child.kill().unwrap();
        child.wait().unwrap();
        let ids = whole_ids(&output);
        let unique: HashSet<&String> = ids.iter().collect();
        assert_eq!(unique.len(), ids.len(), "a custom_id written twice");
    }
    assert!(kills > 0, "every writer finished before its kill");
    assert!(writer().wait().unwrap().success());

    let f = Fixture {
        dir,
        input: input_of(KILLED_LINES, "hi"),
    };
    let store = f.open().unwrap();
    assert!(pending_ids(&store).is_empty());
    assert_eq!(store.counts().unwrap().completed, KILLED_LINES);
    let want: Vec<String> = (0..KILLED_LINES).map(|i| format!("r{i}")).collect();
    assert_eq!(sorted(ids(&output)), sorted(want));
}

#[test]
fn a_snapshot_moves_the_job_to_another_place_and_it_resumes_there_with_the_same_id() {
    let f = Fixture::new(6);
    let store = f.open().unwrap();
    for n in 0..3 {
        store.record_done(&format!("r{n}"), &ok(n)).unwrap();
    }
    let snap = f.dir.path().join("snap");
    store.snapshot(&snap).unwrap();
    let id = store.job().id.clone();
    // Results after the snapshot are not in it: they run again in the new place.
    store.record_done("r3", &ok(3)).unwrap();
    drop(store);

    let elsewhere = tempfile::tempdir().unwrap();
    let moved = Paths::beside(&elsewhere.path().join("out.jsonl"));
    restore_snapshot(&snap, &moved).unwrap();
    // Without `relocate` the state refuses paths other than its own.
    let err = f.open_with(&moved, &Options::default()).err().unwrap();
    assert!(matches!(err, StoreError::DifferentPath { .. }), "{err}");
    let relocate = Options {
        relocate: true,
        ..Options::default()
    };
    let store = f.open_with(&moved, &relocate).unwrap();
    assert_eq!(store.job().id, id);
    assert_eq!(store.job().output_path, moved.output);
    let pending: Vec<String> = store
        .pending()
        .unwrap()
        .into_iter()
        .map(|p| p.custom_id)
        .collect();
    assert_eq!(pending, ["r3", "r4", "r5"]);
    for n in 3..6 {
        store.record_done(&format!("r{n}"), &ok(n)).unwrap();
    }
    assert_eq!(ids(&moved.output), ["r0", "r1", "r2", "r3", "r4", "r5"]);
    drop(store);
    // A place that holds a job (or results) is never overwritten by a snapshot.
    let err = restore_snapshot(&snap, &moved).err().unwrap();
    assert!(matches!(err, StoreError::NotOurs { .. }), "{err}");
}
