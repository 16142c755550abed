//! The recorded bodies in `data/watch/` (see its PROVENANCE.md): each parses, is detected
//! as its engine, and two of them difference into an interval.

use frugal_cost::event::{Capacity, Kind as EventKind};
use frugal_cost::money::{HourlyRate, Money};

use crate::{Interval, Kind, Reading, Snapshot, TargetMeta, bill, parse};

fn body(name: &str) -> String {
    let path = format!("{}/../../data/watch/{name}", env!("CARGO_MANIFEST_DIR"));
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{path}: {e}"))
}

fn read(name: &str) -> Reading {
    let scrape = parse(&body(name)).unwrap_or_else(|e| panic!("{name}: {e}"));
    Reading::detect(&scrape).unwrap_or_else(|| panic!("{name}: no kind detected"))
}

#[test]
fn each_body_is_its_engine() {
    let vllm = read("vllm.prom");
    assert_eq!(vllm.kind, Kind::Vllm);
    assert_eq!(vllm.requests_total, Some(127.0));
    assert_eq!(vllm.prompt_tokens_total, Some(30_211.0));
    assert_eq!(vllm.generation_tokens_total, Some(24_876.0));
    assert_eq!((vllm.running, vllm.waiting), (Some(2.0), Some(0.0)));
    assert_eq!(vllm.model.as_deref(), Some("unsloth/Llama-3.2-1B-Instruct"));

    let tgi = read("tgi.prom");
    assert_eq!(tgi.kind, Kind::Tgi);
    assert_eq!(tgi.requests_total, Some(209.0));
    assert_eq!(tgi.prompt_tokens_total, Some(48_215.0));
    assert_eq!(tgi.generation_tokens_total, Some(31_780.0));
    assert_eq!((tgi.running, tgi.waiting), (Some(4.0), Some(1.0)));
    // Prefill and decode forward passes, summed: TGI's busy seconds.
    assert_eq!(tgi.busy_seconds_total, Some(140.75));

    let llama = read("llamacpp.prom");
    assert_eq!(llama.kind, Kind::Llamacpp);
    assert_eq!(llama.requests_total, None);
    assert_eq!(llama.prompt_tokens_total, Some(6_886.0));
    assert_eq!(llama.generation_tokens_total, Some(3_469.0));
    assert_eq!((llama.running, llama.waiting), (Some(1.0), Some(0.0)));

    let dcgm = read("dcgm.prom");
    assert_eq!(dcgm.kind, Kind::Dcgm);
    assert_eq!(dcgm.gpu_util, Some(0.64));
    assert_eq!(dcgm.gpu_mem_used_bytes, Some(141_346.0 * 1024.0 * 1024.0));
    assert_eq!(dcgm.requests_total, None);
}

#[test]
fn a_minute_of_vllm_billed_with_dcgm_utilization() {
    let gpu = read("dcgm.prom");
    let a = Snapshot {
        at_ms: 1_700_000_000_000,
        reading: read("vllm.prom").with_gpu(&gpu),
    };
    let b = Snapshot {
        at_ms: 1_700_000_060_000,
        reading: read("vllm-later.prom").with_gpu(&gpu),
    };
    let i = Interval::between(&a, &b).unwrap();
    assert!(!i.reset);
    assert_eq!(
        (i.requests, i.input_tokens, i.output_tokens),
        (24, 5_899, 5_076)
    );
    assert_eq!(i.busy_share, Some(0.64));
    let target = TargetMeta {
        name: "vllm".into(),
        workload: "chat".into(),
        model: None,
        instance_type: Some("p5.48xlarge".into()),
        region: None,
        capacity: Some(Capacity::Spot),
    };
    let rate = HourlyRate(Money::from_cents(1_200));
    let ev = bill(&target, rate, a.at_ms, &i).unwrap().events;
    assert_eq!(ev[0].kind, EventKind::Inference);
    assert_eq!(ev[0].cost, Money::from_nanos(128_000_000));
    assert_eq!(ev[1].cost, Money::from_nanos(72_000_000));
    assert_eq!(
        ev[0].model.as_deref(),
        Some("unsloth/Llama-3.2-1B-Instruct")
    );
}

#[test]
fn a_vllm_restart_counts_from_zero() {
    let a = Snapshot {
        at_ms: 0,
        reading: read("vllm-later.prom"),
    };
    let b = Snapshot {
        at_ms: 30_000,
        reading: read("vllm-restarted.prom"),
    };
    let i = Interval::between(&a, &b).unwrap();
    assert!(i.reset);
    assert_eq!((i.requests, i.input_tokens, i.output_tokens), (4, 812, 655));
    // Work running at both ends, no GPU metrics: busy throughout.
    assert_eq!(i.busy_share, Some(1.0));
}

/// One target's body (or fetch error) observed alone.
fn observe(
    state: &mut crate::watch::State,
    target: &crate::watch::Target,
    body: Result<String, String>,
    at_ms: i64,
) -> crate::watch::Outcome {
    let scrape = crate::watch::scrape_of(body);
    state
        .observe_all(std::slice::from_ref(target), vec![scrape], at_ms)
        .remove(0)
}

/// The watcher's state: a baseline, then a bill; a failed scrape is a gap that forgets
/// the last snapshot, so the next reading is a baseline again; the state survives a save.
#[test]
fn the_state_bills_between_scrapes_and_forgets_across_a_gap() {
    use crate::watch::{Outcome, State, Target};
    let target = Target {
        meta: TargetMeta {
            name: "chat".into(),
            workload: "chat".into(),
            model: None,
            instance_type: None,
            region: None,
            capacity: Some(Capacity::OnDemand),
        },
        url: "http://unused/metrics".into(),
        kind: None,
        rate: HourlyRate(Money::from_f64_dollars(3.6).unwrap()),
        host: "unused".into(),
    };
    let mut state = State::default();
    assert!(matches!(
        observe(&mut state, &target, Ok(body("vllm.prom")), 1_000),
        Outcome::Baseline(_)
    ));
    let dir = std::env::temp_dir().join(format!("frugal-watch-state-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let path = dir.join("state.json");
    state.save(&path).unwrap();
    let mut state = State::load(&path).unwrap();
    let Outcome::Billed { interval, bill } =
        observe(&mut state, &target, Ok(body("vllm-later.prom")), 61_000)
    else {
        panic!("no bill")
    };
    assert_eq!(interval.duration_ms, 60_000);
    let cost: Money = bill.events.iter().map(|e| e.cost).sum();
    assert_eq!(
        cost,
        Money::from_f64_dollars(0.06).unwrap(),
        "a minute at $3.60/h"
    );
    assert!(matches!(
        observe(&mut state, &target, Err("down".into()), 121_000),
        Outcome::Gap(_)
    ));
    assert!(matches!(
        observe(&mut state, &target, Ok("<html>".into()), 181_000),
        Outcome::Gap(_)
    ));
    assert!(matches!(
        observe(&mut state, &target, Ok(body("vllm-later.prom")), 241_000),
        Outcome::Baseline(_)
    ));
    std::fs::write(&path, "{").unwrap();
    assert!(
        State::load(&path)
            .unwrap_err()
            .to_string()
            .contains("remove it")
    );
    std::fs::remove_dir_all(&dir).unwrap();
}

fn target(name: &str, url: &str, kind: Option<Kind>) -> crate::watch::Target {
    crate::watch::Target {
        meta: TargetMeta {
            name: name.into(),
            workload: "chat".into(),
            model: None,
            instance_type: None,
            region: None,
            capacity: Some(Capacity::OnDemand),
        },
        url: url.into(),
        kind,
        rate: HourlyRate(Money::from_cents(360)),
        host: crate::watch::Target::url_host(url),
    }
}

/// DCGM on a server's host lends it the GPUs' utilization and memory and is not billed;
/// on a host of its own (or by its `Hostname` label) it is joined or billed as a machine.
#[test]
fn dcgm_joins_the_server_on_its_host_and_is_not_billed_twice() {
    use crate::watch::{Outcome, State};
    let targets = [
        target("vllm", "http://10.0.0.5:8000/metrics", None),
        target("gpus", "http://10.0.0.5:9400/metrics", None),
        target(
            "lonely-gpus",
            "http://10.0.0.9:9400/metrics",
            Some(Kind::Dcgm),
        ),
    ];
    let mut state = State::default();
    let scrape = |v: &str| Ok(parse(&body(v)).unwrap());
    let bodies = |v: &str| vec![scrape(v), scrape("dcgm.prom"), scrape("dcgm.prom")];
    let first = state.observe_all(&targets, bodies("vllm.prom"), 0);
    assert!(matches!(first[0], Outcome::Baseline(ref r) if r.gpu_util == Some(0.64)));
    assert!(matches!(first[1], Outcome::Joined(ref s) if s == &["vllm".to_owned()]));
    assert!(matches!(first[2], Outcome::Baseline(_)));
    let next = state.observe_all(&targets, bodies("vllm-later.prom"), 60_000);
    let Outcome::Billed { interval, bill } = &next[0] else {
        panic!("{next:?}")
    };
    // DCGM's mean of 87% and 41%, not the running samples.
    assert_eq!(interval.busy_share, Some(0.64));
    assert_eq!(bill.span.need_bytes, Some((71_234 + 70_112) << 20));
    assert_eq!(bill.span.busy_ms, 38_400);
    assert!(matches!(next[1], Outcome::Joined(_)));
    let Outcome::Billed { bill: alone, .. } = &next[2] else {
        panic!("{next:?}")
    };
    assert_eq!(
        alone.events[0].requests, 0,
        "a GPU box alone: time, no requests"
    );
    // Joined by the node name DCGM labels its series with, through another address.
    let mut by_label = [
        target("vllm", "http://vllm.internal:8000/metrics", None),
        target("gpus", "http://10.0.0.5:9400/metrics", None),
    ];
    by_label[0].host = "gpu-node-1".into();
    let out =
        State::default().observe_all(&by_label, vec![scrape("vllm.prom"), scrape("dcgm.prom")], 0);
    assert!(matches!(out[1], Outcome::Joined(_)), "{out:?}");
    // A server that is down keeps its GPUs: a gap for both, never a bill.
    let out = State::default().observe_all(
        &targets[..2],
        vec![Err("down".into()), scrape("dcgm.prom")],
        0,
    );
    assert!(matches!(out[0], Outcome::Gap(_)));
    assert!(matches!(out[1], Outcome::Joined(_)), "{out:?}");
}

#[test]
fn a_url_host_without_scheme_port_user_or_path() {
    use crate::watch::Target;
    for (url, host) in [
        ("http://10.0.0.5:8000/metrics", "10.0.0.5"),
        (
            "https://user:pw@gpu-1.example.com/metrics?x=1",
            "gpu-1.example.com",
        ),
        ("http://[::1]:9400/metrics", "::1"),
        ("localhost:9400", "localhost"),
    ] {
        assert_eq!(Target::url_host(url), host, "{url}");
    }
}

/// Bodies captured from real servers (data/watch/PROVENANCE.md): each read as its kind,
/// with the counters and busy seconds it carries.
#[test]
fn captured_llama_server_and_frugal_bodies_read_as_their_kind() {
    let llama = read("llamacpp-0c1e570.prom");
    assert_eq!(llama.kind, Kind::Llamacpp);
    // 174 computed and 0 from the prompt cache.
    assert_eq!(llama.prompt_tokens_total, Some(174.0));
    assert_eq!(llama.generation_tokens_total, Some(56.0));
    assert_eq!((llama.running, llama.waiting), (Some(0.0), Some(0.0)));
    let frugal = read("frugal.prom");
    assert_eq!(frugal.kind, Kind::Frugal);
    assert_eq!(frugal.requests_total, Some(28.0));
    assert_eq!(
        (frugal.prompt_tokens_total, frugal.generation_tokens_total),
        (Some(1462.0), Some(944.0))
    );
    assert_eq!(frugal.busy_seconds_total, Some(14.630187));
    assert_eq!(frugal.model.as_deref(), Some("SmolLM2-135M-Instruct.Q4_1"));
    // llama.cpp's 0 requests are no count; frugal's are.
    let twice = |r: &Reading| {
        let at = |at_ms| Snapshot {
            at_ms,
            reading: r.clone(),
        };
        Interval::between(&at(0), &at(1_000))
            .unwrap()
            .counts_requests
    };
    assert!(!twice(&llama));
    assert!(twice(&frugal));
}

#[test]
fn an_error_is_said_with_its_causes() {
    #[derive(Debug, thiserror::Error)]
    #[error("error sending request")]
    struct Outer(#[source] std::io::Error);
    let e = Outer(std::io::Error::new(
        std::io::ErrorKind::ConnectionRefused,
        "connection refused",
    ));
    assert_eq!(
        frugal_cost::causes::with_causes(&e),
        "error sending request: connection refused"
    );
}
