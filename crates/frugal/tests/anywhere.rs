//! Issue 32: the commands' default data files and the default model are found from any
//! folder. The binary runs from an empty folder, frugal's data folder a temporary one that
//! holds only the models (as `FRUGAL_MODELS=~/.local/share/frugal/models
//! scripts/fetch-models.sh` fills it); the data comes from the binary itself.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{Server, said};

/// `frugal ARGS` run in `cwd`, frugal's data folder `home/frugal`.
fn frugal(cwd: &Path, home: &Path, args: &[&str]) -> Output {
    command(cwd, home).args(args).output().unwrap()
}

fn command(cwd: &Path, home: &Path) -> Command {
    let mut c = Command::new(env!("CARGO_BIN_EXE_frugal"));
    c.current_dir(cwd)
        .env("XDG_DATA_HOME", home)
        .env("HOME", home)
        .arg("--ledger")
        .arg(home.join("ledger.sqlite"));
    c
}

/// The checkout's models, reachable only through the data folder.
fn with_models(home: &Path) {
    std::fs::create_dir_all(home.join("frugal")).unwrap();
    let models = std::fs::canonicalize(frugal_testkit::repo("models")).unwrap();
    std::os::unix::fs::symlink(models, home.join("frugal/models")).unwrap();
}

#[test]
fn plan_s_default_spot_trace_is_found_from_any_folder() {
    let (cwd, home) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let demand = cwd.path().join("demand.csv");
    std::fs::copy(
        frugal_testkit::repo("data/demand-traces/nyc_taxi.csv"),
        &demand,
    )
    .unwrap();
    let args = [
        "plan",
        "--demand",
        "demand.csv",
        "--scale",
        "0.001",
        "--instance",
        "p3.2xlarge",
        "--work",
        "24h",
        "--deadline",
        "36h",
    ];
    let out = frugal(cwd.path(), home.path(), &args);
    assert!(out.status.success(), "{}", said(&out));
    assert!(said(&out).contains("us-east-1c_v100_1"), "{}", said(&out));
    // Installed once into the data folder, byte for byte the shipped trace.
    let trace = "data/spot-traces/preemption/1-node/aws-04-22-2023/us-east-1c_v100_1.json";
    let installed = home.path().join("frugal").join(trace);
    let shipped = std::fs::read(frugal_testkit::repo(trace)).unwrap();
    assert_eq!(std::fs::read(&installed).unwrap(), shipped);
    // A copy that is not the shipped one is replaced; a path the user names wins.
    std::fs::write(&installed, b"{}").unwrap();
    let again = frugal(cwd.path(), home.path(), &args);
    assert!(again.status.success(), "{}", said(&again));
    assert_eq!(std::fs::read(&installed).unwrap(), shipped);
    std::fs::write(cwd.path().join("mine.json"), b"not json").unwrap();
    let mine = frugal(
        cwd.path(),
        home.path(),
        &[&args[..], &["--spot-trace", "mine.json"]].concat(),
    );
    assert!(!mine.status.success());
    assert!(
        said(&mine).contains("--spot-trace mine.json"),
        "{}",
        said(&mine)
    );
}

#[test]
fn eval_s_default_data_and_the_docs_paths_are_found_from_any_folder() {
    let (cwd, home) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    with_models(home.path());
    let model = frugal_engine::DEFAULT_MODEL;
    // The questions by default, the model through the data folder.
    let out = frugal(
        cwd.path(),
        home.path(),
        &[
            "eval",
            "tasks",
            "--model",
            model,
            "--quant",
            "q8_0",
            "--limit",
            "2",
            "--max-tokens",
            "4",
        ],
    );
    assert!(out.status.success(), "{}", said(&out));
    assert!(
        said(&out).contains("2 questions of ") && said(&out).contains("data/cascade/questions"),
        "{}",
        said(&out)
    );
    // The held-out text by the path the docs give.
    let text = "data/eval/shakespeare-heldout.txt";
    let out = frugal(
        cwd.path(),
        home.path(),
        &[
            "eval", "ppl", "--model", model, "--quant", "q8_0", "--text", text, "--chunks", "1",
            "--ctx", "64",
        ],
    );
    assert!(out.status.success(), "{}", said(&out));
    // QQP's pairs and the near misses by default, the embedder through the data folder.
    let out = frugal(
        cwd.path(),
        home.path(),
        &["eval", "embedder", "--limit", "20"],
    );
    assert!(out.status.success(), "{}", said(&out));
    assert!(said(&out).contains("similiar_qqp_full"), "{}", said(&out));
    let out = frugal(cwd.path(), home.path(), &["eval-cache", "--limit", "200"]);
    assert!(out.status.success(), "{}", said(&out));
    assert!(said(&out).contains("paraphrase"), "{}", said(&out));
}

#[test]
fn serve_finds_the_default_model_in_the_data_folder_or_says_how_to_fetch_it() {
    let (cwd, home) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let serve = ["serve", "--port", "0", "--price-per-hour", "1"];
    let out = frugal(cwd.path(), home.path(), &serve);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let frugal_models = home.path().join("frugal/models");
    assert!(
        said(&out).contains(&format!(
            "FRUGAL_MODELS={} scripts/fetch-models.sh smollm2",
            frugal_models.display()
        )),
        "{}",
        said(&out)
    );
    with_models(home.path());
    let mut c = command(cwd.path(), home.path());
    c.args(serve);
    let server = Server::launch(c, tempfile::tempdir().unwrap());
    let (status, _, body) = server.request("GET", "/health", "");
    assert_eq!((status, body.as_str()), (200, "ok"));
    let (head, _) = server.ask("Say hello.", 4);
    assert!(head.contains("x-frugal-cost-usd"), "{head}");
}
