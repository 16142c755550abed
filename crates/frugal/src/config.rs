//! `frugal.toml`: parsed strictly (unknown keys are errors naming the dotted key), then
//! resolved with the command line and environment: CLI > env > file > default.

use std::path::{Path, PathBuf};

use anyhow::{Context, Result, bail};
use frugal_cost::Location;
use frugal_gateway::config::RawServe;
use frugal_watch::fleet::RawWatch;
use serde::Deserialize;

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawConfig {
    #[serde(default)]
    pub ledger: RawLedger,
    #[serde(default)]
    pub prices: RawPrices,
    /// `frugal serve`'s: the gateway library's own raw `[serve]`.
    #[serde(default)]
    pub serve: RawServe,
    #[serde(default)]
    pub watch: RawWatch,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RawLedger {
    /// A SQLite file, relative to the config file.
    pub path: Option<PathBuf>,
    /// A `postgres://` URL (or a path, as `path`).
    pub url: Option<String>,
    /// The gateway's journal for a PostgreSQL ledger: every settled row is written there
    /// first and shipped to the ledger (a SQLite file, relative to the config file); by
    /// default `ledger.spool.sqlite` beside the ledger (see `Config::beside_ledger`). Named
    /// `spool` from when it held rows only while the ledger was away; `journal` is the same key.
    #[serde(alias = "journal")]
    pub spool: Option<PathBuf>,
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
    /// A SQLite file or a PostgreSQL database.
    pub ledger: Location,
    pub price_files: Vec<PathBuf>,
    /// Paths resolved against the config file's folder.
    pub serve: RawServe,
    pub watch: RawWatch,
    /// `ledger.spool`, resolved against the config file's folder.
    pub spool: Option<PathBuf>,
    /// The user's data folder (`$XDG_DATA_HOME`, else `~/.local/share`), which holds
    /// `frugal/` (the ledger, models).
    pub data_home: Option<PathBuf>,
    /// The config file read, if any: `frugal serve` reads its keys again on SIGHUP.
    pub file: Option<PathBuf>,
}

impl Config {
    /// The folder for what frugal keeps beside the ledger (pools' logs, checkpoints,
    /// `frugal watch`'s state): a SQLite ledger's folder; for a PostgreSQL ledger, frugal's
    /// data folder, else the working directory (an empty path, as a bare file name's folder).
    pub fn beside_ledger(&self) -> PathBuf {
        match &self.ledger {
            Location::Sqlite(path) => path.parent().map_or_else(PathBuf::new, Path::to_owned),
            Location::Postgres(_) => self
                .data_home
                .as_ref()
                .map_or_else(PathBuf::new, |h| h.join("frugal")),
        }
    }

    /// The ledger, its folder made first.
    pub fn open_ledger(&self) -> Result<frugal_cost::Ledger> {
        if let Some(dir) = self.ledger.folder() {
            std::fs::create_dir_all(dir)
                .with_context(|| format!("cannot create the ledger's folder {}", dir.display()))?;
        }
        Ok(frugal_cost::Ledger::open(&self.ledger)?)
    }

    /// The gateway meter's journal for a PostgreSQL ledger: `ledger.spool` (or
    /// `ledger.journal`), else `ledger.spool.sqlite` beside the ledger.
    pub fn spool(&self) -> PathBuf {
        self.spool
            .clone()
            .unwrap_or_else(|| self.beside_ledger().join("ledger.spool.sqlite"))
    }
}

/// The sources a setting may come from, strongest first.
pub struct Sources<'a> {
    pub config_flag: Option<&'a Path>,
    pub config_env: Option<PathBuf>,
    pub ledger_flag: Option<&'a str>,
    pub ledger_env: Option<String>,
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
    let (raw, base, file) = match explicit {
        Some(path) => {
            let text = std::fs::read_to_string(&path)
                .with_context(|| format!("cannot read config {}", path.display()))?;
            (
                parse(&text, &path)?,
                path.parent().map(Path::to_owned),
                Some(path),
            )
        }
        None => {
            let local = PathBuf::from("frugal.toml");
            match std::fs::read_to_string(&local) {
                Ok(text) => (parse(&text, &local)?, Some(PathBuf::from(".")), Some(local)),
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    (RawConfig::default(), None, None)
                }
                Err(e) => return Err(e).context("cannot read config frugal.toml"),
            }
        }
    };
    let relative = |p: PathBuf| match &base {
        Some(dir) if p.is_relative() => dir.join(p),
        _ => p,
    };
    let from_file = match (raw.ledger.path, raw.ledger.url) {
        (Some(_), Some(_)) => bail!("invalid config: give `ledger.path` or `ledger.url`, not both"),
        (Some(path), None) => Some(Location::Sqlite(relative(path))),
        (None, Some(url)) => Some(match Location::parse(&url) {
            Location::Sqlite(path) => Location::Sqlite(relative(path)),
            postgres => postgres,
        }),
        (None, None) => None,
    };
    let ledger = match (sources.ledger_flag, sources.ledger_env, from_file) {
        (Some(flag), _, _) => Location::parse(flag),
        (None, Some(env), _) => Location::parse(&env),
        (None, None, Some(file)) => file,
        (None, None, None) => match &sources.data_home {
            Some(home) => Location::Sqlite(home.join("frugal").join("ledger.sqlite")),
            None => bail!("no ledger location: pass --ledger PATH|URL or set FRUGAL_LEDGER"),
        },
    };
    let mut price_files: Vec<PathBuf> = raw.prices.files.into_iter().map(relative).collect();
    price_files.extend(sources.price_flags.iter().cloned());
    let mut serve = raw.serve;
    serve.model = serve.model.map(relative);
    serve.embedder = serve.embedder.map(relative);
    serve.shadow_examples = serve.shadow_examples.map(relative);
    for r in &mut serve.route {
        r.skip_examples = r.skip_examples.take().map(relative);
        r.router = r.router.take().map(relative);
    }
    Ok(Config {
        ledger,
        price_files,
        serve,
        watch: raw.watch,
        spool: raw.ledger.spool.map(relative),
        data_home: sources.data_home,
        file,
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
            ledger_flag: flag,
            ledger_env: env.map(str::to_owned),
            price_flags: &[],
            data_home: None,
        };
        let c = resolve(sources(Some("flag.sqlite"), Some("env.sqlite"))).unwrap();
        assert_eq!(c.ledger, Location::Sqlite("flag.sqlite".into()));
        let c = resolve(sources(None, Some("env.sqlite"))).unwrap();
        assert_eq!(c.ledger, Location::Sqlite("env.sqlite".into()));
        let url = "postgres://u:pw@db.internal/ledger";
        let c = resolve(sources(None, Some(url))).unwrap();
        assert_eq!(c.ledger, Location::Postgres(url.into()));
        let c = resolve(sources(None, None)).unwrap();
        assert_eq!(
            c.ledger,
            Location::Sqlite(dir.path().join("from-file.sqlite"))
        );
        assert_eq!(c.price_files, vec![dir.path().join("p.toml")]);
        assert_eq!(c.serve.model, Some(dir.path().join("m.gguf")));
        assert_eq!(c.serve.port, Some(9000));
    }

    #[test]
    fn the_spool_is_beside_the_ledger_unless_the_file_names_one() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("frugal.toml");
        let url = "postgres://u:pw@db.internal/ledger";
        let resolved = |text: &str| {
            std::fs::write(&cfg, text).unwrap();
            resolve(Sources {
                config_flag: Some(cfg.as_path()),
                config_env: None,
                ledger_flag: Some(url),
                ledger_env: None,
                price_flags: &[],
                data_home: Some(PathBuf::from("/home/u/.local/share")),
            })
            .unwrap()
        };
        assert_eq!(
            resolved("").spool(),
            Path::new("/home/u/.local/share/frugal/ledger.spool.sqlite")
        );
        assert_eq!(
            resolved("[ledger]\nspool = 'spool/s.sqlite'\n").spool(),
            dir.path().join("spool/s.sqlite"),
            "relative to the config file"
        );
    }
}
