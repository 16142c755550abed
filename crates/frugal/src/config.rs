//! `frugal.toml`: parsed strictly (unknown keys are errors naming the dotted key), then
//! resolved with the command line and environment: CLI > env > file > default.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub ledger: RawLedger,
    #[serde(default)]
    pub prices: RawPrices,
    #[serde(default)]
    pub serve: RawServe,
}

/// `[serve]`: defaults for `frugal serve`, each overridden by its flag.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawServe {
    /// Relative to the config file.
    pub model: Option<PathBuf>,
    pub name: Option<String>,
    pub host: Option<String>,
    pub port: Option<u16>,
    pub price_per_hour: Option<String>,
    pub instance: Option<String>,
    pub max_batch: Option<usize>,
    pub max_queue: Option<usize>,
    pub workload: Option<String>,
    pub cache: Option<bool>,
    pub cache_mb: Option<u64>,
    pub cache_ttl: Option<u64>,
    pub cache_redis: Option<String>,
    pub semantic_cache: Option<bool>,
    pub semantic_threshold: Option<f32>,
    /// Questions the semantic cache holds at most [default: 10,000].
    pub semantic_entries: Option<usize>,
    /// The local model's cache is one for every tenant [default: false, one per tenant].
    pub shared_cache: Option<bool>,
    /// Relative to the config file.
    pub embedder: Option<PathBuf>,
    /// OpenAI-compatible servers served beside the local model.
    #[serde(default)]
    pub upstream: Vec<RawUpstream>,
    /// API keys; with none, the API is open.
    #[serde(default)]
    pub key: Vec<RawKey>,
    /// Cascade routes (e.g. `model: "auto"`).
    #[serde(default)]
    pub route: Vec<RawRoute>,
}

/// `[[serve.route]]`: a cascade, cheapest tier first.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawRoute {
    pub name: String,
    pub tiers: Vec<String>,
    /// Quantile of the token logprobs taken as the confidence [default: 0, the minimum].
    pub quantile: Option<f64>,
    /// Accept a tier's answer at or above this confidence (a logprob, <= 0).
    pub threshold: f32,
    /// JSON lines of prompts labelled by whether the cheap tier answered them right
    /// (`frugal eval-route --skip-examples FILE` writes them); relative to the config file.
    pub skip_examples: Option<PathBuf>,
    /// Skip the cheap tier when fewer than this share of the nearest examples were
    /// answered right [default: 0.5].
    pub skip_below: Option<f32>,
    /// Nearest examples that vote [default: 8].
    pub skip_k: Option<usize>,
    /// The semantic cache's least cosine for this route [default: `[serve]`'s].
    pub semantic_threshold: Option<f32>,
    /// One cache for every tenant on this route [default: false].
    pub shared_cache: Option<bool>,
}

/// `[[serve.key]]`: one API key, by its hash (`frugal keys new` prints the entry).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawKey {
    /// Whose key: it names the cache namespace and the budgets.
    pub tenant: String,
    /// Hex SHA-256 of the key.
    pub sha256: String,
    pub daily_usd: Option<String>,
    pub monthly_usd: Option<String>,
}

/// `[[serve.upstream]]`: one OpenAI-compatible server, by the name clients use for it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawUpstream {
    pub name: String,
    /// Base URL, e.g. `https://api.openai.com/v1`.
    pub url: String,
    /// The upstream's name for the model [default: `name`].
    pub model: Option<String>,
    /// Environment variable holding the API key (sent as a bearer token).
    pub api_key_env: Option<String>,
    /// The `[[model]]` of the price files that prices its tokens [default: `model`].
    pub price: Option<String>,
    /// A self-hosted server: USD per hour of its machine, which its calls share...
    pub price_per_hour: Option<String>,
    /// ...or the machine's instance type, priced on demand from the catalog.
    pub instance: Option<String>,
    pub timeout_s: Option<u64>,
    pub retries: Option<u32>,
    /// The semantic cache's least cosine for this model [default: `[serve]`'s].
    pub semantic_threshold: Option<f32>,
    /// One cache for every tenant on this model [default: false].
    pub shared_cache: Option<bool>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLedger {
    pub path: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawPrices {
    /// Price files layered over the built-in catalog, relative to the config file.
    #[serde(default)]
    pub files: Vec<PathBuf>,
}

/// What the commands run on, resolved once.
#[derive(Debug)]
pub struct Config {
    pub ledger: PathBuf,
    pub price_files: Vec<PathBuf>,
    pub serve: RawServe,
}

/// The sources a setting may come from, strongest first.
pub struct Sources<'a> {
    pub config_flag: Option<&'a Path>,
    pub config_env: Option<PathBuf>,
    pub ledger_flag: Option<&'a Path>,
    pub ledger_env: Option<PathBuf>,
    pub price_flags: &'a [PathBuf],
    pub data_home: Option<PathBuf>,
}

pub fn parse(text: &str, path: &Path) -> Result<RawConfig> {
    let de = toml::Deserializer::parse(text)
        .map_err(|e| anyhow::anyhow!("{e}"))
        .with_context(|| format!("invalid config {}", path.display()))?;
    serde_path_to_error::deserialize(de).map_err(|e| {
        let key = e.path().to_string();
        let msg = e.inner().message().to_owned();
        if key == "." {
            anyhow::anyhow!("invalid config {}: {msg}", path.display())
        } else {
            anyhow::anyhow!("invalid config {}: `{key}`: {msg}", path.display())
        }
    })
}

pub fn resolve(sources: Sources<'_>) -> Result<Config> {
    let explicit = sources
        .config_flag
        .map(Path::to_owned)
        .or(sources.config_env);
    let (raw, base) = match explicit {
        Some(path) => {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read config {}", path.display()))?;
            (parse(&text, &path)?, path.parent().map(Path::to_owned))
        }
        None => {
            let local = PathBuf::from("frugal.toml");
            match std::fs::read_to_string(&local) {
                Ok(text) => (parse(&text, &local)?, Some(PathBuf::from("."))),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => (RawConfig::default(), None),
                Err(e) => return Err(e).context("cannot read config frugal.toml"),
            }
        }
    };
    let relative = |p: PathBuf| match &base {
        Some(dir) if p.is_relative() => dir.join(p),
        _ => p,
    };
    let ledger = match (sources.ledger_flag, sources.ledger_env, raw.ledger.path) {
        (Some(flag), _, _) => flag.to_owned(),
        (None, Some(env), _) => env,
        (None, None, Some(file)) => relative(file),
        (None, None, None) => match sources.data_home {
            Some(home) => home.join("frugal").join("ledger.sqlite"),
            None => bail!("no ledger location: pass --ledger PATH or set FRUGAL_LEDGER"),
        },
    };
    let mut price_files: Vec<PathBuf> = raw.prices.files.into_iter().map(relative).collect();
    price_files.extend(sources.price_flags.iter().cloned());
    let mut serve = raw.serve;
    serve.model = serve.model.map(relative);
    serve.embedder = serve.embedder.map(relative);
    for r in &mut serve.route {
        r.skip_examples = r.skip_examples.take().map(relative);
    }
    Ok(Config {
        ledger,
        price_files,
        serve,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_keys_are_named_with_their_path() {
        let err = parse("[ledger]\npth = 'x'\n", Path::new("frugal.toml")).unwrap_err();
        let text = format!("{err:#}");
        assert!(
            text.contains("`ledger.pth`") || text.contains("unknown field `pth`"),
            "{text}"
        );
        let err = parse("[prices]\nfiles = 'a.toml'\n", Path::new("f.toml")).unwrap_err();
        assert!(format!("{err:#}").contains("`prices.files`"), "{err:#}");
        let err = parse("[ledger\n", Path::new("f.toml")).unwrap_err();
        assert!(
            format!("{err:#}").contains("invalid config f.toml"),
            "{err:#}"
        );
    }

    #[test]
    fn cli_beats_env_beats_file() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("frugal.toml");
        std::fs::write(
            &cfg,
            "[ledger]\npath = 'from-file.sqlite'\n[prices]\nfiles = ['p.toml']\n[serve]\nmodel = 'm.gguf'\nport = 9000\n",
        )
        .unwrap();
        let sources = |flag: Option<&'static str>, env: Option<&str>| Sources {
            config_flag: Some(cfg.as_path()),
            config_env: None,
            ledger_flag: flag.map(Path::new),
            ledger_env: env.map(PathBuf::from),
            price_flags: &[],
            data_home: None,
        };
        let c = resolve(sources(Some("flag.sqlite"), Some("env.sqlite"))).unwrap();
        assert_eq!(c.ledger, PathBuf::from("flag.sqlite"));
        let c = resolve(sources(None, Some("env.sqlite"))).unwrap();
        assert_eq!(c.ledger, PathBuf::from("env.sqlite"));
        let c = resolve(sources(None, None)).unwrap();
        assert_eq!(c.ledger, dir.path().join("from-file.sqlite"));
        assert_eq!(c.price_files, vec![dir.path().join("p.toml")]);
        assert_eq!(c.serve.model, Some(dir.path().join("m.gguf")));
        assert_eq!(c.serve.port, Some(9000));
    }
}
