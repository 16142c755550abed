//! `frugal eval ppl|tasks` end to end on the real default model: the gate passes a Q8_0
//! re-quantization and fails a Q4_0 one, a saved reference reads back the same figures, bad
//! input is refused with a clear error, and `frugal serve --quant` says the last evaluation.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use common::{Server, model, said};
use serde_json::Value;

fn repo(path: &str) -> PathBuf {
    frugal_testkit::repo(path)
}

fn text() -> PathBuf {
    repo("data/eval/shakespeare-heldout.txt")
}

/// `frugal eval ARGS` with the results recorded under `home`.
fn frugal(home: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_frugal"))
        .env("XDG_DATA_HOME", home)
        .env_remove("FRUGAL_ISA")
        .arg("--ledger")
        .arg(home.join("ledger.sqlite"))
        .arg("eval")
        .args(args)
        .output()
        .unwrap()
}

/// `eval ppl` of the default model as `quant`, on one chunk of 256 tokens.
fn ppl(home: &Path, quant: &str, extra: &[&str]) -> Output {
    let args = ["--quant", quant, "--ctx", "256", "--chunks", "2", "--json"];
    ppl_on(home, &text(), &[&args, extra].concat())
}

/// `frugal ppl` of the test model on `text`, with `extra` flags.
fn ppl_on(home: &Path, text: &Path, extra: &[&str]) -> Output {
    let m = model();
    let mut args = vec!["ppl", "--model", m.to_str().unwrap(), "--text"];
    args.push(text.to_str().unwrap());
    args.extend_from_slice(extra);
    frugal(home, &args)
}

/// Asserts that `out` is a refusal (exit 1) that says `why`.
fn refused(out: &Output, why: &str) {
    assert_eq!(out.status.code(), Some(1), "{}", said(out));
    assert!(said(out).contains(why), "{}", said(out));
}

fn json(out: &Output) -> Value {
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| panic!("{e}: {}", said(out)))
}

#[test]
fn the_gate_passes_q8_0_fails_q4_0_and_reads_a_saved_reference() {
    let home = tempfile::tempdir().unwrap();
    let gate = [
        "--max-kld",
        "0.05",
        "--min-top1",
        "0.85",
        "--max-ppl-ratio",
        "1.05",
    ];

    let good = ppl(home.path(), "q8_0", &gate);
    assert!(good.status.success(), "{}", said(&good));
    let g = json(&good);
    assert_eq!(g["tokens_scored"], 2 * 127);
    assert_eq!(g["gate"]["passed"], true);
    let r = &g["reference"];
    assert!(r["kld"]["mean"].as_f64().unwrap() < 0.02, "{r}");
    assert!(r["top1"].as_f64().unwrap() > 0.9, "{r}");
    assert!(r["what"].as_str().unwrap().ends_with("dequantized to F32"));
    // Against the full vocabulary: the top-k figure is a lower bound.
    let top_k_mean = r["kld_top_k_mean"].as_f64().unwrap();
    assert!(top_k_mean <= r["kld"]["mean"].as_f64().unwrap());

    let saved = home.path().join("ref.bin");
    let bad = ppl(
        home.path(),
        "q4_0",
        &[&gate[..], &["--save-reference", saved.to_str().unwrap()]].concat(),
    );
    assert_eq!(bad.status.code(), Some(1), "{}", said(&bad));
    let b = json(&bad);
    assert_eq!(b["gate"]["passed"], false);
    let err = String::from_utf8_lossy(&bad.stderr);
    assert!(
        err.contains("gate failed: mean KL divergence") && err.contains("> --max-kld 0.05"),
        "{err}"
    );
    let live = b["reference"]["kld_top_k_mean"].as_f64().unwrap();

    // The saved reference gives what the live one's top k gave, without running it.
    let again = ppl(
        home.path(),
        "q4_0",
        &["--reference", saved.to_str().unwrap()],
    );
    assert!(again.status.success(), "{}", said(&again));
    let a = json(&again);
    assert_eq!(a["reference"]["kld_from_top_k"], true);
    let read = a["reference"]["kld"]["mean"].as_f64().unwrap();
    assert!(
        (read - live).abs() < 1e-6 * live.max(1.0),
        "{read} vs {live}"
    );
    assert_eq!(a["reference"]["ppl"], b["reference"]["ppl"]);
    assert_eq!(a["ppl"], b["ppl"]);

    // Every run was recorded; `frugal serve --quant` says the latest, gate and all.
    let store = std::fs::read_to_string(home.path().join("frugal/evals.jsonl")).unwrap();
    assert_eq!(store.lines().count(), 3, "{store}");
    let xdg = home.path().to_str().unwrap();
    for (quant, expect) in [
        ("q4_0", "as Q4_0, last evaluated"),
        ("q8_0", "gate passed"),
        ("q4_k", "no held-out evaluation of"),
    ] {
        let server = Server::start_env(
            tempfile::tempdir().unwrap(),
            &[],
            &["--quant", quant],
            &[("XDG_DATA_HOME", xdg)],
        );
        let logs = server.logs();
        assert!(logs.contains(expect), "{quant}: {logs}");
        if quant != "q4_0" {
            server.stop();
            continue;
        }
        // What it served, the report shows beside the quality it kept run that way.
        server.ask("Say hi.", 4);
        let (_, dir) = server.stop();
        let report = common::report_with_data_home(dir.path().join("ledger.sqlite"), xdg, &[]);
        let table = report
            .split("Quality kept")
            .nth(1)
            .unwrap_or_else(|| panic!("{report}"));
        // The latest Q4_0 run read the saved reference with no gate (its PPL 20-30% above
        // the reference's); Q8_0's passed its gate, but Q8_0 was not served (issue 32).
        let row = |t: &str| {
            let line = table.lines().find(|l| l.contains(t));
            line.unwrap_or_else(|| panic!("no {t} row: {report}"))
                .to_owned()
        };
        assert!(row("Q4_0").contains("% of the reference"), "{report}");
        assert!(row("Q4_0").contains("+q4_0"), "{report}");
        assert!(!row("Q4_0").contains("passed"), "{report}");
        assert!(!table.contains("Q8_0"), "{report}");
    }
}

#[test]
fn bad_input_is_refused_clearly() {
    let home = tempfile::tempdir().unwrap();
    let short = home.path().join("short.txt");
    std::fs::write(&short, "To be, or not to be.").unwrap();
    let out = ppl_on(home.path(), &short, &[]);
    refused(&out, "shorter than one context of 512");

    // A damaged saved reference.
    let damaged = home.path().join("damaged.bin");
    std::fs::write(&damaged, [&b"FRGLREF1"[..], &[7u8; 200]].concat()).unwrap();
    let out = ppl(
        home.path(),
        "q8_0",
        &["--reference", damaged.to_str().unwrap()],
    );
    refused(&out, "truncated or damaged");

    // A gate with nothing to compare with.
    let out = ppl_on(home.path(), &text(), &["--max-kld", "0.1"]);
    refused(&out, "pass --reference");

    // A reference with another vocabulary (the larger tier's).
    let large = frugal_testkit::model(frugal_engine::LARGE_MODEL);
    let out = ppl(
        home.path(),
        "q8_0",
        &["--reference", large.to_str().unwrap()],
    );
    refused(&out, "another vocabulary");
}

#[test]
fn tasks_count_accuracy_and_flips() {
    let home = tempfile::tempdir().unwrap();
    let m = model();
    let q = repo("data/cascade/questions.jsonl");
    let run = |quant: &str, max_flips: &str| {
        frugal(
            home.path(),
            &[
                "tasks",
                "--model",
                m.to_str().unwrap(),
                "--quant",
                quant,
                "--questions",
                q.to_str().unwrap(),
                "--limit",
                "12",
                "--max-tokens",
                "12",
                "--max-flips",
                max_flips,
                "--json",
            ],
        )
    };
    let out = run("q8_0", "12");
    assert!(out.status.success(), "{}", said(&out));
    let v = json(&out);
    assert_eq!(v["questions"], 12);
    let flips = v["flips"].as_u64().unwrap();
    let listed = v["right_only_in_reference"].as_array().unwrap().len()
        + v["right_only_in_model"].as_array().unwrap().len();
    assert_eq!(flips as usize, listed);
    let (acc, reference) = (
        v["accuracy"].as_f64().unwrap(),
        v["reference_accuracy"].as_f64().unwrap(),
    );
    assert!(reference > 0.0, "the reference answers some: {v}");
    // Accuracy moves by the flips, and no further.
    let moved = (acc - reference).abs() * 12.0;
    assert!(moved <= flips as f64 + 1e-9, "{v}");
    // Q4_0 of a Q4_1 model flips answers; a gate of zero flips catches any.
    let out = run("q4_0", "0");
    let v = json(&out);
    if v["flips"].as_u64().unwrap() > 0 {
        refused(&out, "flips > --max-flips 0");
    } else {
        assert!(out.status.success(), "{}", said(&out));
    }
}

#[test]
fn the_embedder_gate_passes_q8_0_and_fails_q4_0() {
    let home = tempfile::tempdir().unwrap();
    let e = common::embedder();
    let pairs = repo("data/semantic-cache/similiar_qqp_full.json.gz");
    let run = |quant: &str| {
        frugal(
            home.path(),
            &[
                "embedder",
                "--embedder",
                e.to_str().unwrap(),
                "--pairs",
                pairs.to_str().unwrap(),
                "--quant",
                quant,
                "--limit",
                "60",
                "--min-cosine",
                "0.99",
                "--max-auc-drop",
                "0.05",
                "--json",
            ],
        )
    };
    let good = run("q8_0");
    assert!(good.status.success(), "{}", said(&good));
    let g = json(&good);
    assert_eq!(g["texts"], 120);
    assert!(g["cosine"]["mean"].as_f64().unwrap() > 0.999, "{g}");
    assert!(g["auc"]["f32"].as_f64().unwrap() > 0.7, "{g}");
    let bad = run("q4_0");
    refused(&bad, "gate failed: mean cosine");
    // A type whose blocks do not fit the embedder's 384-wide rows is named.
    let k = run("q4_k");
    assert!(
        said(&k).contains("Q4_K needs a multiple of 256 weights, got 384"),
        "{}",
        said(&k)
    );
}
