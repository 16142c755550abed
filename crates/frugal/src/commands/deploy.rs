//! `frugal deploy kubernetes`: writes the manifests the gateway library makes from
//! `frugal.toml`, lists them, and says what the gateway's Secret must hold.

use std::io::Write;
use std::path::Path;

use anyhow::{Context, Result};
use frugal_cost::Catalog;
use frugal_gateway::deploy::{self as kube, Target};

use crate::cli::KubernetesArgs;
use crate::config;

/// `config` is the `--config` file [default: ./frugal.toml]. It is parsed again rather than
/// resolved: its paths (a pool's `model`, the embedder) are the containers', not this machine's.
pub fn kubernetes(config: Option<&Path>, catalog: &Catalog, args: &KubernetesArgs) -> Result<()> {
    let path = config.unwrap_or(Path::new("frugal.toml"));
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("cannot read config {}", path.display()))?;
    let raw = config::parse(&text, path)?;
    let target = Target {
        namespace: args.namespace.clone(),
        image: args.image.clone(),
        gateway_replicas: args.gateway_replicas,
        prometheus: args.prometheus.clone(),
        ledger: raw.ledger.url.clone(),
    };
    let manifests = kube::manifests(&raw.serve, catalog, &target)?;
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("cannot create {}", args.out.display()))?;
    let mut out = std::io::stdout().lock();
    for m in &manifests {
        let file = args.out.join(&m.file);
        std::fs::write(&file, m.yaml())
            .with_context(|| format!("cannot write {}", file.display()))?;
        writeln!(out, "{}  {}", file.display(), m.kinds().join(", "))?;
    }
    let secrets = kube::secret_keys(&raw.serve, &target);
    if !secrets.is_empty() {
        writeln!(
            out,
            "\nThe gateway reads these from Secret {} (kubectl -n {} create secret generic {} \\\n  --from-literal=KEY=VALUE ...), never from these files:",
            kube::GATEWAY,
            args.namespace,
            kube::GATEWAY
        )?;
        let width = secrets.iter().map(|s| s.key.len()).max().unwrap_or(0);
        for s in &secrets {
            writeln!(out, "  {:width$}  {}", s.key, s.holds)?;
        }
    }
    Ok(())
}
