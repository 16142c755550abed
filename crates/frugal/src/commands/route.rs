//! `frugal route train`: fits a learned router (`frugal_gateway::cascade::learned`) on
//! labelled prompts and writes the file a `[[serve.route]]` names.

use std::io::Write;

use anyhow::{Context, Result};
use frugal_gateway::assemble::{load_embedder, read_skip_examples};
use frugal_gateway::cascade::learned::RouterFile;

use crate::cli::RouteTrainArgs;

pub fn train(args: &RouteTrainArgs) -> Result<()> {
    let mut examples = Vec::new();
    for path in &args.from {
        examples.extend(read_skip_examples(path)?);
    }
    let embedder = load_embedder(&args.embedder, "")?;
    let labelled: Vec<(&str, bool)> = examples.iter().map(|e| (e.prompt.as_str(), e.ok)).collect();
    let (file, agree) =
        RouterFile::train(&embedder, &labelled).context("cannot embed the examples")?;
    let text = serde_json::to_string(&file)?;
    let part = args.out.with_extension("part");
    std::fs::write(&part, text)
        .and_then(|()| std::fs::rename(&part, &args.out))
        .with_context(|| format!("cannot write {}", args.out.display()))?;
    let mut out = std::io::stdout().lock();
    writeln!(
        out,
        "{}: {} examples ({} answered right by the cheap tier); on them, the router agrees with the label on {} ({:.1}%)",
        args.out.display(),
        file.examples,
        file.right,
        agree,
        100.0 * agree as f64 / file.examples.max(1) as f64
    )?;
    writeln!(
        out,
        "In frugal.toml, on a [[serve.route]]:\nrouter = \"{}\"\nskip_below = 0.5   # skip the cheap tier below this chance of being right (`frugal eval-route` chooses it)",
        args.out.display()
    )?;
    Ok(())
}
