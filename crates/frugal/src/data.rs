//! Default data files and models, found from any folder. A path that exists is taken as it
//! is (a user's file wins, and a checkout's `data/` and `models/` are read in place). A
//! relative one that does not is, in order: a file compiled into the binary (the
//! libraries' `BUNDLED`: every default data file, and those the docs name), installed into
//! frugal's data folder (`$XDG_DATA_HOME/frugal`, else `~/.local/share/frugal`) and read
//! there; else the same path under that folder, where larger data and the models go
//! (`FRUGAL_MODELS=~/.local/share/frugal/models scripts/fetch-models.sh` fetches these).

use std::path::{Component, Path, PathBuf};

use anyhow::{Context, Result};

use crate::cli::{Command, EvalCommand, RouteCommand};

/// Every file compiled in, by its path in the repository.
fn bundled(path: &Path) -> Option<&'static [u8]> {
    let path: PathBuf = path
        .components()
        .filter(|c| *c != Component::CurDir)
        .collect();
    [
        frugal_cost::plan::spot::BUNDLED,
        frugal_engine::BUNDLED,
        frugal_semantic::BUNDLED,
        frugal_gateway::BUNDLED,
    ]
    .into_iter()
    .flatten()
    .find(|(name, _)| Path::new(name) == path)
    .map(|(_, bytes)| *bytes)
}

/// frugal's data folder.
pub struct Data {
    dir: PathBuf,
}

impl Data {
    /// `data_home` is `$XDG_DATA_HOME` or `~/.local/share`; without either, the system's
    /// temporary folder holds what is installed.
    pub fn new(data_home: Option<&Path>) -> Data {
        let home = data_home.map_or_else(std::env::temp_dir, Path::to_owned);
        Data {
            dir: home.join("frugal"),
        }
    }

    /// Where `path` is read from (see the module's comment); a path found nowhere is given
    /// back as it is, for its reader to say so.
    pub fn locate(&self, path: &Path) -> Result<PathBuf> {
        if path.exists() || path.is_absolute() {
            return Ok(path.to_owned());
        }
        let installed = self.dir.join(path);
        if let Some(bytes) = bundled(path) {
            install(&installed, bytes)?;
            return Ok(installed);
        }
        Ok(if installed.exists() {
            installed
        } else {
            path.to_owned()
        })
    }

    /// [`Data::locate`] on an optional path.
    fn locate_opt(&self, path: &mut Option<PathBuf>) -> Result<()> {
        if let Some(p) = path {
            *p = self.locate(p)?;
        }
        Ok(())
    }

    /// The default model of `frugal serve`, or how to fetch it.
    pub fn default_model(&self) -> Result<PathBuf> {
        let default = Path::new(frugal_engine::DEFAULT_MODEL);
        let found = self.locate(default)?;
        anyhow::ensure!(
            found.exists(),
            "no --model given, and the default is in neither {} nor {}: \
             `FRUGAL_MODELS={} scripts/fetch-models.sh smollm2` (in a checkout of frugal) fetches it, \
             or pass --model FILE.gguf",
            default.display(),
            self.dir.join(default).display(),
            self.dir.join("models").display(),
        );
        Ok(found)
    }

    /// Every input path of `command` that has a default or that the docs name, located.
    pub fn locate_inputs(&self, command: &mut Command) -> Result<()> {
        match command {
            Command::Plan(a) => a.spot_trace = self.locate(&a.spot_trace)?,
            Command::EvalRoute(a) => {
                for p in &mut a.questions {
                    *p = self.locate(p)?;
                }
                a.small = self.locate(&a.small)?;
                a.large = self.locate(&a.large)?;
                a.embedder = self.locate(&a.embedder)?;
            }
            Command::Route(RouteCommand::Train(a)) => a.embedder = self.locate(&a.embedder)?,
            Command::EvalCache(a) => {
                a.pairs = self.locate(&a.pairs)?;
                a.embedder = self.locate(&a.embedder)?;
                if a.near_miss.is_empty() {
                    a.near_miss = frugal_semantic::NEAR_MISS.map(PathBuf::from).to_vec();
                }
                for p in &mut a.near_miss {
                    *p = self.locate(p)?;
                }
                if a.verifier != Path::new("none") {
                    a.verifier = self.locate(&a.verifier)?;
                }
            }
            Command::Eval(EvalCommand::Ppl(a)) => {
                a.model.model = self.locate(&a.model.model)?;
                a.text = self.locate(&a.text)?;
                self.locate_opt(&mut a.reference)?;
            }
            Command::Eval(EvalCommand::Tasks(a)) => {
                a.model.model = self.locate(&a.model.model)?;
                a.questions = self.locate(&a.questions)?;
                self.locate_opt(&mut a.reference)?;
            }
            Command::Eval(EvalCommand::Embedder(a)) => {
                a.embedder = self.locate(&a.embedder)?;
                a.pairs = self.locate(&a.pairs)?;
            }
            Command::Bench(a) => {
                self.locate_opt(&mut a.workload)?;
                self.locate_opt(&mut a.trace)?;
            }
            Command::Quantize(a) => a.input = self.locate(&a.input)?,
            _ => {}
        }
        Ok(())
    }
}

/// Writes a compiled-in file where it is read from, unless it is there already as it is
/// (a newer binary's data replaces an older one's); a rename, so a reader never sees half.
fn install(path: &Path, bytes: &[u8]) -> Result<()> {
    if std::fs::read(path).is_ok_and(|had| had == bytes) {
        return Ok(());
    }
    let dir = path.parent().unwrap_or(Path::new("."));
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {}", dir.display()))?;
    let part = path.with_extension(format!("part-{}", std::process::id()));
    std::fs::write(&part, bytes).with_context(|| format!("cannot write {}", part.display()))?;
    std::fs::rename(&part, path).with_context(|| format!("cannot write {}", path.display()))?;
    Ok(())
}
