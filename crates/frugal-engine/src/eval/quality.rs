//! What each model file and quantization was last measured to keep in quality: `frugal eval`
//! appends a line per run to a JSON-lines file, and `frugal serve --quant` says the latest
//! for what it is about to serve (or that nothing measured it), so a saving never runs
//! without its cost in quality in sight.
//!
//! A file is known by its canonical path, size and modification time: cheap to check at every
//! start (hashing a model would read it twice), and any rewrite of the file changes them.

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::UNIX_EPOCH;

use serde::{Deserialize, Serialize};

/// Where results are recorded: `record` when given, else the user's data folder's
/// `frugal/evals.jsonl`; nowhere without either.
pub fn store(record: Option<&Path>, data_home: Option<&Path>) -> Option<PathBuf> {
    record
        .map(Path::to_owned)
        .or_else(|| data_home.map(|h| h.join("frugal").join("evals.jsonl")))
}

/// A model file as it is now.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileId {
    pub path: PathBuf,
    pub size: u64,
    pub modified_ms: u64,
}

impl FileId {
    pub fn of(path: &Path) -> std::io::Result<FileId> {
        let path = path.canonicalize()?;
        let meta = std::fs::metadata(&path)?;
        let modified_ms = meta
            .modified()?
            .duration_since(UNIX_EPOCH)
            .map_or(0, |d| d.as_millis() as u64);
        Ok(FileId {
            path,
            size: meta.len(),
            modified_ms,
        })
    }
}

/// One evaluation's outcome.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Record {
    /// When it ran (RFC 3339, UTC).
    pub at: String,
    /// `ppl` or `tasks`.
    pub kind: String,
    pub model: FileId,
    /// The type the model was re-quantized to at load (`Q4_0`), if any.
    pub quant: Option<String>,
    /// The KV cache's type when not exact (`q8_0`).
    #[serde(default)]
    pub kv: Option<String>,
    /// What it was measured against, in words.
    pub reference: Option<String>,
    /// The held-out data (a text or a questions file).
    pub data: String,
    /// The figures a person reads, in one line.
    pub summary: String,
    /// Whether the gate passed, when one was set.
    pub gate: Option<bool>,
    /// Every figure, for machines.
    pub figures: serde_json::Value,
}

/// Appends `record` to the store at `path` (made with its folder if missing).
pub fn append(path: &Path, record: &Record) -> std::io::Result<()> {
    if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir)?;
    }
    let mut line = serde_json::to_vec(record).map_err(std::io::Error::other)?;
    line.push(b'\n');
    // One write of a whole line in append mode: concurrent runs never interleave a line.
    let mut f = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(path)?;
    f.write_all(&line)
}

/// A model file as it is run: re-quantized to `quant` at load, with a `kv` KV cache (each
/// `None` when as stored, exact), as records name them.
#[derive(Debug, Clone, Copy)]
pub struct AsRun<'a> {
    pub path: &'a Path,
    pub quant: Option<&'a str>,
    pub kv: Option<&'a str>,
}

impl AsRun<'_> {
    /// In words: `model.gguf as Q4_0 with a q8_0 KV cache`.
    pub fn words(&self) -> String {
        let mut what = self.path.display().to_string();
        if let Some(q) = self.quant {
            what += &format!(" as {q}");
        }
        if let Some(kv) = self.kv {
            what += &format!(" with a {kv} KV cache");
        }
        what
    }

    /// The flags that run it so: ` --quant q4_0 --kv q8_0`.
    pub fn flags(&self) -> String {
        let mut flags = String::new();
        if let Some(q) = self.quant {
            flags += &format!(" --quant {}", q.to_lowercase());
        }
        if let Some(kv) = self.kv {
            flags += &format!(" --kv {kv}");
        }
        flags
    }

    /// The name `frugal serve` serves the file under when it runs it this way (unless told
    /// another): [`served_name`].
    pub fn served_name(&self) -> Option<String> {
        served_name(self.path, self.quant, self.kv)
    }

    /// The latest record of each kind in the store at `store` for the file as it is now, run
    /// this way; none when the file cannot be read.
    pub fn latest(&self, store: &Path) -> Vec<Record> {
        FileId::of(self.path)
            .map_or_else(|_| Vec::new(), |f| latest(store, &f, self.quant, self.kv))
    }
}

/// The latest record of each kind for `model` as `quant` and `kv` run it, oldest kind first.
pub fn latest(path: &Path, model: &FileId, quant: Option<&str>, kv: Option<&str>) -> Vec<Record> {
    all_latest(path)
        .into_iter()
        .filter(|r| r.model == *model && r.quant.as_deref() == quant && r.kv.as_deref() == kv)
        .collect()
}

/// The name a model file is served under, run so: the file's name without `.gguf`, then
/// `+q4_0` when its weights are re-quantized at load and `+kv-q8_0` when its KV cache is
/// quantized (`SmolLM2-135M-Instruct.Q4_1+q4_0`), so that what is listed, answered and
/// billed says what runs, and a measurement of one way of running a file is never shown
/// against another. `None` for a path without a file name.
pub fn served_name(path: &Path, quant: Option<&str>, kv: Option<&str>) -> Option<String> {
    let mut name = path.file_stem()?.to_str()?.to_owned();
    if let Some(q) = quant {
        name += &format!("+{}", q.to_lowercase());
    }
    if let Some(kv) = kv {
        name += &format!("+kv-{}", kv.to_lowercase());
    }
    Some(name)
}

impl Record {
    /// The name `frugal serve` serves the measured file under, run as it was measured.
    pub fn served_name(&self) -> Option<String> {
        served_name(&self.model.path, self.quant.as_deref(), self.kv.as_deref())
    }
}

/// The records of the models `served` (by name), each beside the name it matched: a record
/// matches the name its file is served under run as it was measured ([`served_name`]), as
/// `frugal serve` names it unless told otherwise.
pub fn of_served<'a>(records: &'a [Record], served: &[&str]) -> Vec<(String, &'a Record)> {
    records
        .iter()
        .filter_map(|r| {
            let name = r.served_name()?;
            served.contains(&name.as_str()).then_some((name, r))
        })
        .collect()
}

/// The latest record of each kind for every file and way of running it, in the order they
/// were last measured: what `frugal report` shows beside the savings. Lines that do not parse
/// (a newer version's, a torn one) are skipped: the store only informs.
pub fn all_latest(path: &Path) -> Vec<Record> {
    let Ok(file) = std::fs::File::open(path) else {
        return Vec::new();
    };
    let mut latest: Vec<Record> = Vec::new();
    for line in std::io::BufReader::new(file).lines().map_while(Result::ok) {
        let Ok(r) = serde_json::from_str::<Record>(&line) else {
            continue;
        };
        latest.retain(|k| {
            (&k.model, &k.quant, &k.kv, &k.kind) != (&r.model, &r.quant, &r.kv, &r.kind)
        });
        latest.push(r);
    }
    latest
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record(kind: &str, model: &FileId, quant: Option<&str>, summary: &str) -> Record {
        Record {
            at: "2026-12-05T00:00:00Z".into(),
            kind: kind.into(),
            model: model.clone(),
            quant: quant.map(str::to_owned),
            kv: None,
            reference: None,
            data: "t.txt".into(),
            summary: summary.into(),
            gate: None,
            figures: serde_json::json!({}),
        }
    }

    /// Issue 32: a FAILED Q4_0 evaluation was shown against the file served unmodified.
    #[test]
    fn a_record_matches_only_the_name_of_the_way_it_was_run() {
        let id = FileId {
            path: PathBuf::from("/m/SmolLM2-135M-Instruct.Q4_1.gguf"),
            size: 1,
            modified_ms: 1,
        };
        let mut failed = record("ppl", &id, Some("Q4_0"), "q4_0");
        failed.gate = Some(false);
        let mut kv = record("ppl", &id, None, "kv");
        kv.kv = Some("q8_0".into());
        let records = [
            record("ppl", &id, None, "as stored"),
            failed,
            kv,
            record("ppl", &id, Some("Q8_0"), "q8_0"),
        ];
        let shown = |served: &str| -> Vec<(String, String)> {
            of_served(&records, &[served])
                .into_iter()
                .map(|(n, r)| (n, r.summary.clone()))
                .collect()
        };
        let stem = "SmolLM2-135M-Instruct.Q4_1";
        assert_eq!(shown(stem), [(stem.into(), "as stored".into())]);
        let q4 = format!("{stem}+q4_0");
        assert_eq!(shown(&q4), [(q4.clone(), "q4_0".into())]);
        let kv8 = format!("{stem}+kv-q8_0");
        assert_eq!(shown(&kv8), [(kv8.clone(), "kv".into())]);
        let run = AsRun {
            path: &id.path,
            quant: Some("Q4_0"),
            kv: None,
        };
        assert_eq!(run.served_name(), Some(q4));
    }

    #[test]
    fn the_latest_of_each_kind_for_the_file_and_type() {
        let dir = tempfile::tempdir().unwrap();
        let model = dir.path().join("m.gguf");
        std::fs::write(&model, b"weights").unwrap();
        let id = FileId::of(&model).unwrap();
        let store = dir.path().join("sub/evals.jsonl");
        assert!(latest(&store, &id, Some("Q4_0"), None).is_empty());
        append(&store, &record("ppl", &id, Some("Q4_0"), "old")).unwrap();
        append(&store, &record("ppl", &id, Some("Q8_0"), "other type")).unwrap();
        append(&store, &record("tasks", &id, Some("Q4_0"), "tasks")).unwrap();
        append(&store, &record("ppl", &id, Some("Q4_0"), "new")).unwrap();
        std::fs::OpenOptions::new()
            .append(true)
            .open(&store)
            .unwrap()
            .write_all(b"{torn\n")
            .unwrap();
        let got: Vec<String> = latest(&store, &id, Some("Q4_0"), None)
            .into_iter()
            .map(|r| r.summary)
            .collect();
        assert_eq!(got, ["tasks", "new"]);
        assert!(latest(&store, &id, None, None).is_empty());
        let every: Vec<String> = all_latest(&store).into_iter().map(|r| r.summary).collect();
        assert_eq!(every, ["other type", "tasks", "new"]);

        // A rewritten file is another file.
        std::fs::write(&model, b"other weights").unwrap();
        let changed = FileId::of(&model).unwrap();
        assert!(latest(&store, &changed, Some("Q4_0"), None).is_empty());
    }
}
