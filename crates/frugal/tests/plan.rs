//! `frugal plan` end to end: the nyc_taxi demand backtested on p3.2xlarge, the spot replay
//! against a deadline, the HTML page, and bad demand files refused with the line named.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

fn plan(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_frugal"))
        .current_dir(root())
        .arg("--ledger")
        .arg(dir.join("ledger.sqlite"))
        .args(["--prices", "examples/prices.toml", "plan"])
        .args(args)
        .output()
        .unwrap()
}

fn said(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

#[test]
fn nyc_taxi_backtests_within_two_points_of_hindsight_and_spot_meets_a_deadline() {
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("plan.html");
    let out = plan(
        dir.path(),
        &[
            "--demand",
            "data/demand-traces/nyc_taxi.csv",
            "--scale",
            "0.001",
            "--instance",
            "p3.2xlarge",
            "--fit",
            "30d",
            "--test",
            "30d",
            "--deadline",
            "36h",
            "--json",
            "--html",
            html.to_str().unwrap(),
        ],
    );
    assert!(out.status.success(), "{}", said(&out));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let r = &v["recommended"];
    assert_eq!(r["reserved_1y"], 15, "{r}");
    assert_eq!(r["reserved_3y"], serde_json::Value::Null, "no 3-year price");
    assert_eq!(
        r["on_demand_peak"], 25,
        "above the 15 committed: the peak is 40"
    );
    assert_eq!(r["spot"], 1, "{r}");
    let windows = v["backtest"]["ours"]["windows"].as_array().unwrap();
    assert_eq!(windows.len(), 6);
    for w in windows {
        let regret = w["regret"].as_f64().unwrap();
        assert!((0.0..2.0).contains(&regret), "{w}");
    }
    let lookbacks = v["backtest"]["lookbacks"].as_array().unwrap();
    assert_eq!(lookbacks.len(), 3, "7, 30 and 60 days");
    let deadline = &v["spot"]["deadline"];
    assert_eq!(deadline["spot_only_meets"], false, "{deadline}");
    assert_eq!(
        deadline["uniform_progress"]["deadline_met"], true,
        "{deadline}"
    );
    let spot = deadline["uniform_progress"]["cost"].as_i64().unwrap();
    let on_demand = v["spot"]["on_demand"]["cost"].as_i64().unwrap();
    assert!(spot < on_demand, "{spot} against {on_demand}");
    let page = std::fs::read_to_string(&html).unwrap();
    for part in [
        "Demand over time",
        "Backtest on held-out windows",
        "Spot for a run",
    ] {
        assert!(page.contains(part), "{part}");
    }
    assert!(page.contains("<svg"));
}

#[test]
fn bad_demand_and_impossible_windows_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let csv = dir.path().join("d.csv");
    let bad = [
        (
            "timestamp,value\n2024-01-01 00:00:00,3\n2024-01-01 01:00:00,-2\n",
            "line 3",
        ),
        (
            "timestamp,value\n2024-01-01 01:00:00,3\n2024-01-01 00:00:00,2\n",
            "line 3",
        ),
        (
            "timestamp,value\n2024-01-01 00:00:00,3\n2024-01-01 00:00:00,2\n",
            "line 3",
        ),
        (
            "timestamp,value\n2024-01-01 00:00:00,3\n2024-01-01 05:00:00,2\n",
            "no sample",
        ),
        ("timestamp,value\n2999-01-01 00:00:00,3\n", "future"),
    ];
    for (text, says) in bad {
        std::fs::write(&csv, text).unwrap();
        let out = plan(
            dir.path(),
            &[
                "--demand",
                csv.to_str().unwrap(),
                "--instance",
                "p3.2xlarge",
            ],
        );
        let text_out = said(&out);
        assert_eq!(out.status.code(), Some(1), "{text}: {text_out}");
        assert!(text_out.contains(says), "{text}: {text_out}");
    }
    // Two days of demand: no backtest window fits, and no term is recommended on so little.
    let two_days: String = (0..48)
        .map(|h| {
            format!(
                "2024-01-0{} {:02}:00:00,{}\n",
                1 + h / 24,
                h % 24,
                2 + h % 3
            )
        })
        .collect();
    std::fs::write(&csv, two_days).unwrap();
    let out = plan(
        dir.path(),
        &[
            "--demand",
            csv.to_str().unwrap(),
            "--instance",
            "p3.2xlarge",
            "--fit",
            "30d",
        ],
    );
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    assert!(
        said(&out).contains("longer than the demand"),
        "{}",
        said(&out)
    );
    let out = plan(
        dir.path(),
        &[
            "--demand",
            csv.to_str().unwrap(),
            "--instance",
            "p3.2xlarge",
        ],
    );
    assert!(out.status.success(), "{}", said(&out));
    assert!(said(&out).contains("no reserved_1y"), "{}", said(&out));
    // No demand at all, and a workload the ledger does not have.
    let out = plan(dir.path(), &["--instance", "p3.2xlarge"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(said(&out).contains("--demand"), "{}", said(&out));
}
