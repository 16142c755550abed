//! `frugal keys new`: a key and the config lines that admit it.

use std::io::Write;

use anyhow::{Context, Result};

use crate::cli::NewKeyArgs;

pub fn new(args: &NewKeyArgs) -> Result<()> {
    for v in [&args.daily_usd, &args.monthly_usd].into_iter().flatten() {
        v.parse::<frugal_cost::Money>()
            .with_context(|| format!("invalid budget {v:?}"))?;
    }
    let key =
        frugal_gateway::admit::keys::new_key().context("cannot get random bytes for the key")?;
    let mut out = std::io::stdout().lock();
    writeln!(out, "key (shown once; frugal keeps only its hash): {key}\n")?;
    writeln!(out, "[[serve.key]]")?;
    writeln!(out, "tenant = {:?}", args.tenant)?;
    writeln!(
        out,
        "sha256 = {:?}",
        frugal_gateway::admit::keys::hash_key(&key)
    )?;
    if let Some(v) = &args.daily_usd {
        writeln!(out, "daily_usd = {v:?}")?;
    }
    if let Some(v) = &args.monthly_usd {
        writeln!(out, "monthly_usd = {v:?}")?;
    }
    Ok(())
}
