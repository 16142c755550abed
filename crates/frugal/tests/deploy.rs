//! `frugal deploy kubernetes` end to end: the real binary writes the manifests, and
//! scripts/validate-manifests.py checks them offline against Kubernetes' schemas and KEDA's
//! ScaledObject CRD, as a cluster would.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use frugal_cost::Catalog;
use frugal_gateway::config::RawServe;
use frugal_gateway::pool::Kind;
use frugal_gateway::pool::settings::pool;
use serde_json::Value;

const CONFIG: &str = r#"
[serve]
port = 8080

[[serve.upstream]]
name = "gpt-4o-mini"
url = "https://api.openai.com/v1"
api_key_env = "OPENAI_API_KEY"

[[serve.pool]]
name = "Qwen_2.5"
backend = "process"
command = "llama-server -m {model} --host 0.0.0.0 --port {port} --alias \"$HOME: # x\""
model = "/models/qwen2.5-0.5b.gguf"
image = "ghcr.io/ggml-org/llama.cpp:server"
min_replicas = 0
max_replicas = 4
target_in_flight = 8
scale_to_zero_after = "5m"
stable_window = "60s"
health = "/health"

[[serve.pool]]
name = "smol"
backend = "local"
model = "/models/smollm2.gguf"
min_replicas = 1
max_replicas = 2
scale_to_zero_after = "90s"

[[serve.pool]]
name = "big"
backend = "external"
url = "http://vllm.inference:8000/v1"
"#;

fn frugal(dir: &Path, args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_frugal"))
        .current_dir(dir)
        .env_remove("FRUGAL_CONFIG")
        .env("FRUGAL_LEDGER", dir.join("ledger.sqlite"))
        .env("HOME", dir)
        .args(args)
        .output()
        .unwrap()
}

/// `frugal deploy kubernetes` of `dir`'s frugal.toml into `dir/k8s`, with `extra` flags.
fn deploy(dir: &Path, extra: &[&str]) -> Output {
    let mut args = vec![
        "deploy",
        "kubernetes",
        "--config",
        "frugal.toml",
        "--out",
        "k8s",
    ];
    args.extend(extra);
    frugal(dir, &args)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

fn script() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../scripts/validate-manifests.py")
}

/// python3 with the validator's modules, or a failure saying how to get them: never a skip.
fn python() {
    let ok = Command::new("python3")
        .args(["-c", "import kubernetes_validate, jsonschema, yaml"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "the manifests' validation needs python3 with kubernetes-validate and jsonschema: \
         python3 -m pip install kubernetes-validate jsonschema (`make test` installs them)"
    );
}

/// Each file's YAML documents, read by PyYAML (a real YAML reader, not frugal's writer).
fn read(dir: &Path) -> BTreeMap<String, Vec<Value>> {
    let mut files: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .collect();
    files.sort();
    let out = Command::new("python3")
        .args([
            "-c",
            "import json, os, sys, yaml\n\
             json.dump({os.path.basename(f): [d for d in yaml.safe_load_all(open(f)) if d]\n\
                        for f in sys.argv[1:]}, sys.stdout)",
        ])
        .args(&files)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", text(&out.stderr));
    serde_json::from_slice(&out.stdout).unwrap()
}

fn object<'a>(files: &'a BTreeMap<String, Vec<Value>>, file: &str, kind: &str) -> &'a Value {
    files[file].iter().find(|o| o["kind"] == kind).unwrap()
}

fn validate(dir: &Path) -> Output {
    Command::new("python3")
        .arg(script())
        .arg(dir)
        .output()
        .unwrap()
}

#[test]
fn manifests_are_written_and_valid() {
    python();
    let tmp = tempfile::tempdir().unwrap();
    std::fs::write(tmp.path().join("frugal.toml"), CONFIG).unwrap();
    let out = deploy(tmp.path(), &["--namespace", "ml"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed = text(&out.stdout);
    assert!(
        listed.contains("frugal-gateway.yaml  ConfigMap, Deployment, Service")
            && listed.contains("frugal-pool-qwen-2-5.yaml  Deployment, Service, ScaledObject")
            && listed.contains("frugal-pool-smol.yaml"),
        "{listed}"
    );

    let dir = tmp.path().join("k8s");
    let files = read(&dir);
    assert_eq!(
        files.keys().collect::<Vec<_>>(),
        [
            "frugal-gateway.yaml",
            "frugal-pool-qwen-2-5.yaml",
            "frugal-pool-smol.yaml"
        ],
        "the external pool has no objects"
    );

    let qwen = &object(&files, "frugal-pool-qwen-2-5.yaml", "ScaledObject")["spec"];
    assert_eq!(qwen["scaleTargetRef"]["name"], "frugal-pool-qwen-2-5");
    assert_eq!(
        (&qwen["minReplicaCount"], &qwen["maxReplicaCount"]),
        (&0.into(), &4.into())
    );
    assert_eq!(qwen["cooldownPeriod"], 300);
    let trigger = &qwen["triggers"][0];
    assert_eq!(trigger["type"], "metrics-api");
    assert_eq!(
        trigger["metadata"]["url"],
        "http://frugal-gateway.ml.svc:9090/v1/pools/Qwen_2.5/scale"
    );
    assert_eq!(trigger["metadata"]["targetValue"], "8");
    let smol = &object(&files, "frugal-pool-smol.yaml", "ScaledObject")["spec"];
    assert_eq!(
        (&smol["minReplicaCount"], &smol["cooldownPeriod"]),
        (&1.into(), &90.into())
    );

    let replica = &object(&files, "frugal-pool-qwen-2-5.yaml", "Deployment")["spec"]["template"]["spec"]
        ["containers"][0];
    assert_eq!(
        replica["command"],
        serde_json::json!([
            "llama-server",
            "-m",
            "/models/qwen2.5-0.5b.gguf",
            "--host",
            "0.0.0.0",
            "--port",
            "8080",
            "--alias",
            "$$HOME: # x"
        ])
    );
    let service = &object(&files, "frugal-pool-qwen-2-5.yaml", "Service")["spec"]["ports"][0];
    assert_eq!(service["port"], 8080);

    // The gateway's config: every pool external, at its Service.
    let config = object(&files, "frugal-gateway.yaml", "ConfigMap")["data"]["frugal.toml"]
        .as_str()
        .unwrap();
    #[derive(serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    struct File {
        serve: RawServe,
    }
    let serve = toml::from_str::<File>(config).unwrap().serve;
    assert_eq!(serve.upstream.len(), 1);
    let urls: Vec<String> = serve
        .pool
        .iter()
        .map(|p| match pool(p, &Catalog::default()).unwrap().kind {
            Kind::External { url } => url,
            other => panic!("pool {} is {other:?} in\n{config}", p.name),
        })
        .collect();
    assert_eq!(
        urls,
        [
            "http://frugal-pool-qwen-2-5:8080/v1",
            "http://frugal-pool-smol:8080/v1",
            "http://vllm.inference:8000/v1"
        ]
    );
    assert_eq!(serve.pool[0].max_replicas, Some(4));

    let out = validate(&dir);
    assert!(
        out.status.success(),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
    assert!(
        text(&out.stdout).contains("9 passed, 0 failed"),
        "{}",
        text(&out.stdout)
    );

    // The validator catches what a cluster would refuse, so the pass above means something:
    // a wrong type, an unknown field, and min above max (the CRD's CEL rule).
    let edit = |file: &str, from: &str, to: &str| {
        let path = dir.join(file);
        let text = std::fs::read_to_string(&path).unwrap();
        assert!(text.contains(from), "{from} not in {file}:\n{text}");
        std::fs::write(&path, text.replacen(from, to, 1)).unwrap();
    };
    edit(
        "frugal-pool-qwen-2-5.yaml",
        "maxReplicaCount: 4\n",
        "maxReplicaCount: \"four\"\n",
    );
    edit("frugal-pool-smol.yaml", "periodSeconds:", "periodSecs:");
    edit(
        "frugal-pool-smol.yaml",
        "minReplicaCount: 1\n",
        "minReplicaCount: 3\n",
    );
    let out = validate(&dir);
    let report = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{report}{}", text(&out.stderr));
    for expected in [
        "ScaledObject/frugal-pool-qwen-2-5: spec.maxReplicaCount: 'four' is not of type 'integer'",
        "Deployment/frugal-pool-smol: Kubernetes 1.30: spec.template.spec.containers.0.readinessProbe: Additional properties are not allowed ('periodSecs' was unexpected)",
        "ScaledObject/frugal-pool-smol: spec: minReplicaCount must be less than or equal to maxReplicaCount",
        "6 passed, 3 failed",
    ] {
        assert!(report.contains(expected), "{expected}\nnot in\n{report}");
    }
}

#[test]
fn bad_pools_are_refused_by_name() {
    let tmp = tempfile::tempdir().unwrap();
    let deploy = |config: &str| {
        std::fs::write(tmp.path().join("frugal.toml"), config).unwrap();
        let out = deploy(tmp.path(), &[]);
        assert!(!out.status.success());
        text(&out.stderr)
    };

    let err = deploy(&CONFIG.replace("image = \"ghcr.io/ggml-org/llama.cpp:server\"\n", ""));
    assert!(
        err.contains("pool `Qwen_2.5`: a process pool needs `image`"),
        "{err}"
    );

    let err = deploy(&format!(
        "{CONFIG}\n[[serve.pool]]\nname = \"qwen 2.5\"\nbackend = \"local\"\nmodel = \"m.gguf\"\n"
    ));
    assert!(
        err.contains(
            "pools `Qwen_2.5` and `qwen 2.5` both become the Kubernetes name `frugal-pool-qwen-2-5`"
        ),
        "{err}"
    );
    assert!(
        !tmp.path().join("k8s").exists(),
        "nothing is written on an error"
    );
}

/// Gateways that share a PostgreSQL ledger, Redis budgets and Prometheus-summed demand, from
/// `frugal.toml`; their credentials reach only the Secret's list, never a file.
#[test]
fn replicated_gateways_share_the_ledger_and_budgets_and_keep_credentials_secret() {
    python();
    let tmp = tempfile::tempdir().unwrap();
    let shared = format!(
        "[ledger]\nurl = \"postgres://frugal:pg-s3cret@db.data:5432/ledger\"\n{}",
        CONFIG.replace(
            "port = 8080\n",
            "port = 8080\ncache_redis = \"redis://:redis-s3cret@redis.data:6379/\"\n\
             budget_redis = \"redis://:redis-s3cret@redis.data:6379/1\"\n\
             [[serve.key]]\ntenant = \"team-a\"\nsha256 = \"ab\"\ndaily_usd = \"20\"\n",
        )
    );
    std::fs::write(tmp.path().join("frugal.toml"), &shared).unwrap();
    let deploy =
        |extra: &[&str]| deploy(tmp.path(), &[&["--gateway-replicas", "3"], extra].concat());

    let out = deploy(&[]);
    assert!(!out.status.success());
    let err = text(&out.stderr);
    assert!(
        err.contains("3 gateway replicas need pools scaled on their demand at every gateway")
            && err.contains("--prometheus"),
        "{err}"
    );

    let out = deploy(&["--prometheus", "http://prometheus.monitoring.svc:9090"]);
    assert!(out.status.success(), "{}", text(&out.stderr));
    let listed = text(&out.stdout);
    for line in [
        "FRUGAL_BUDGET_REDIS  redis://***@redis.data:6379/1",
        "FRUGAL_CACHE_REDIS   redis://***@redis.data:6379/",
        "FRUGAL_LEDGER        postgres://frugal:***@db.data:5432/ledger",
        "OPENAI_API_KEY       the API key",
    ] {
        assert!(listed.contains(line), "{line}\nnot in\n{listed}");
    }
    assert!(!listed.contains("s3cret"), "{listed}");

    let dir = tmp.path().join("k8s");
    for entry in std::fs::read_dir(&dir).unwrap() {
        let written = std::fs::read_to_string(entry.unwrap().path()).unwrap();
        assert!(!written.contains("s3cret"), "{written}");
    }
    let files = read(&dir);
    let gateway = &object(&files, "frugal-gateway.yaml", "Deployment")["spec"];
    assert_eq!(gateway["replicas"], 3);
    let env = gateway["template"]["spec"]["containers"][0]["env"]
        .as_array()
        .unwrap();
    for var in ["FRUGAL_LEDGER", "FRUGAL_CACHE_REDIS", "FRUGAL_BUDGET_REDIS"] {
        assert!(
            env.iter()
                .any(|e| e["name"] == var && e["valueFrom"]["secretKeyRef"]["key"] == var),
            "{var} from the Secret: {env:?}"
        );
    }
    let trigger =
        &object(&files, "frugal-pool-qwen-2-5.yaml", "ScaledObject")["spec"]["triggers"][0];
    assert_eq!(trigger["type"], "prometheus");
    assert_eq!(
        trigger["metadata"]["serverAddress"],
        "http://prometheus.monitoring.svc:9090"
    );
    let out = validate(&dir);
    assert!(
        out.status.success() && text(&out.stdout).contains("9 passed, 0 failed"),
        "{}{}",
        text(&out.stdout),
        text(&out.stderr)
    );
}
