//! Checkpoints and the final model file.
//!
//! A checkpoint is a directory `<checkpoint dir>/<step>` holding:
//!
//! * `state.bin`, everything needed to resume, little-endian:
//!
//!   | bytes        | field                                                     |
//!   |--------------|-----------------------------------------------------------|
//!   | 8            | magic `FRUGCKPT`                                          |
//!   | u32          | format version (1)                                        |
//!   | 5 × u64      | vocab, context, embed, hidden, batch                      |
//!   | u64          | seed                                                      |
//!   | u32          | learning rate (f32 bits)                                  |
//!   | u64          | FNV-1a 64 of the data file                                |
//!   | u64          | step (steps done)                                         |
//!   | u64          | n, the number of parameters                               |
//!   | 3 × n × f32  | parameters, Adam first moment m, Adam second moment v     |
//!   | u64          | FNV-1a 64 of all the bytes before it                      |
//!
//!   Batches depend only on (seed, step) and Adam's bias correction only on the step, so
//!   there is no RNG or data position to store.
//! * `meta.json`: step, last loss and hyper-parameters, for people.
//!
//! It is written as `.tmp-<step>`, every file fsynced, then renamed to `<step>` and the parent
//! directory fsynced: the supervisor only ever sees complete checkpoints.
//!
//! The model file (`--out`) holds the weights only, little-endian: magic `FRUGMLP1`, u32
//! version (1), u32 vocab, context, embed, hidden, the `vocab` bytes of the vocabulary, the
//! parameters as f32 (layout in `model.rs`), and an FNV-1a 64 of all the bytes before it.

use std::fs::{self, File};
use std::io::Write;
use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, Result, bail, ensure};
use serde::Serialize;

use crate::hash::fnv1a64;
use crate::hparams::HParams;
use crate::model::State;

const MAGIC: &[u8; 8] = b"FRUGCKPT";
const VERSION: u32 = 1;
const MODEL_MAGIC: &[u8; 8] = b"FRUGMLP1";
const MODEL_VERSION: u32 = 1;

fn put_u32(buf: &mut Vec<u8>, x: u32) {
    buf.extend_from_slice(&x.to_le_bytes());
}

fn put_u64(buf: &mut Vec<u8>, x: u64) {
    buf.extend_from_slice(&x.to_le_bytes());
}

fn put_f32s(buf: &mut Vec<u8>, xs: &[f32]) {
    for x in xs {
        buf.extend_from_slice(&x.to_le_bytes());
    }
}

fn seal(mut buf: Vec<u8>) -> Vec<u8> {
    let sum = fnv1a64(&buf);
    put_u64(&mut buf, sum);
    buf
}

/// The bytes of `state.bin`.
pub fn encode(hp: &HParams, state: &State) -> Vec<u8> {
    let n = state.params.len();
    let mut buf = Vec::with_capacity(100 + 12 * n);
    buf.extend_from_slice(MAGIC);
    put_u32(&mut buf, VERSION);
    for x in [hp.vocab, hp.context, hp.embed, hp.hidden, hp.batch] {
        put_u64(&mut buf, x as u64);
    }
    put_u64(&mut buf, hp.seed);
    put_u32(&mut buf, hp.lr.to_bits());
    put_u64(&mut buf, hp.data_hash);
    put_u64(&mut buf, state.step);
    put_u64(&mut buf, n as u64);
    for xs in [&state.params, &state.m, &state.v] {
        put_f32s(&mut buf, xs);
    }
    seal(buf)
}

/// Reads fields off the front of a byte slice.
struct Reader<'a>(&'a [u8]);

impl<'a> Reader<'a> {
    fn take(&mut self, n: usize) -> Result<&'a [u8]> {
        ensure!(self.0.len() >= n, "truncated");
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    fn u32(&mut self) -> Result<u32> {
        let b = self.take(4)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self) -> Result<u64> {
        Ok((u64::from(self.u32()?)) | (u64::from(self.u32()?) << 32))
    }

    fn usize(&mut self) -> Result<usize> {
        Ok(usize::try_from(self.u64()?)?)
    }

    fn f32s(&mut self, n: usize) -> Result<Vec<f32>> {
        let bytes = self.take(n.checked_mul(4).context("size overflow")?)?;
        Ok(bytes
            .chunks_exact(4)
            .map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))
            .collect())
    }
}

/// Checks magic and checksum, returning the bytes between them.
fn unseal<'a>(bytes: &'a [u8], magic: &[u8; 8], what: &str) -> Result<&'a [u8]> {
    ensure!(
        bytes.len() >= magic.len() + 8,
        "{what} is truncated ({} bytes)",
        bytes.len()
    );
    ensure!(
        bytes.starts_with(magic),
        "not a {what} (bad magic {:?})",
        String::from_utf8_lossy(&bytes[..8])
    );
    let (body, sum) = bytes.split_at(bytes.len() - 8);
    let stored = u64::from_le_bytes([
        sum[0], sum[1], sum[2], sum[3], sum[4], sum[5], sum[6], sum[7],
    ]);
    let actual = fnv1a64(body);
    ensure!(
        stored == actual,
        "{what} is corrupt or truncated (checksum {actual:#018x}, stored {stored:#018x})"
    );
    Ok(&body[magic.len()..])
}

/// Parses `state.bin` and checks that it belongs to a run with hyper-parameters `hp`.
pub fn decode(bytes: &[u8], hp: &HParams) -> Result<State> {
    let mut r = Reader(unseal(bytes, MAGIC, "checkpoint state")?);
    let version = r.u32()?;
    ensure!(
        version == VERSION,
        "checkpoint format version {version}, this trainer reads {VERSION}"
    );
    let saved = HParams {
        vocab: r.usize()?,
        context: r.usize()?,
        embed: r.usize()?,
        hidden: r.usize()?,
        batch: r.usize()?,
        seed: r.u64()?,
        lr: f32::from_bits(r.u32()?),
        data_hash: r.u64()?,
    };
    if saved != *hp {
        bail!(
            "checkpoint hyper-parameters differ from this run's: {}",
            differences(&saved, hp)
        );
    }
    let step = r.u64()?;
    let n = r.usize()?;
    ensure!(
        n == hp.n_params(),
        "checkpoint has {n} parameters, the model has {}",
        hp.n_params()
    );
    let state = State {
        step,
        params: r.f32s(n)?,
        m: r.f32s(n)?,
        v: r.f32s(n)?,
    };
    ensure!(r.0.is_empty(), "{} unexpected bytes at the end", r.0.len());
    Ok(state)
}

/// "hidden: checkpoint 64, run 128; ..." for every field that differs.
fn differences(saved: &HParams, run: &HParams) -> String {
    let field = |name, a: &dyn Fn(&HParams) -> String| (name, a(saved), a(run));
    [
        field("vocab", &|h| h.vocab.to_string()),
        field("context", &|h| h.context.to_string()),
        field("embed", &|h| h.embed.to_string()),
        field("hidden", &|h| h.hidden.to_string()),
        field("batch", &|h| h.batch.to_string()),
        field("seed", &|h| h.seed.to_string()),
        field("lr", &|h| h.lr.to_string()),
        field("data file hash", &|h| format!("{:#018x}", h.data_hash)),
    ]
    .into_iter()
    .filter(|(_, a, b)| a != b)
    .map(|(name, a, b)| format!("{name}: checkpoint {a}, run {b}"))
    .collect::<Vec<_>>()
    .join("; ")
}

/// Reads and checks the checkpoint directory `dir`.
pub fn load(dir: &Path, hp: &HParams) -> Result<State> {
    let path = dir.join("state.bin");
    let bytes = fs::read(&path).with_context(|| format!("reading {}", path.display()))?;
    decode(&bytes, hp).with_context(|| format!("checking {}", path.display()))
}

#[derive(Serialize)]
struct Meta<'a> {
    step: u64,
    loss: f32,
    format: &'static str,
    params: usize,
    hparams: &'a HParams,
}

/// Test knobs that act while `state.bin` is half written.
#[derive(Default)]
pub struct Faults {
    /// Sleep this long after the first half.
    pub delay: Duration,
    /// Abort the process after the first half (a crash mid-checkpoint).
    pub crash: bool,
}

fn sync_dir(dir: &Path) -> Result<()> {
    File::open(dir)
        .and_then(|d| d.sync_all())
        .with_context(|| format!("fsync {}", dir.display()))
}

fn write_synced(path: &Path, bytes: &[u8]) -> Result<()> {
    let mut f = File::create(path).with_context(|| format!("creating {}", path.display()))?;
    f.write_all(bytes)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", path.display()))
}

/// Writes and publishes the checkpoint of `state` under `root`; returns its directory.
pub fn save(
    root: &Path,
    hp: &HParams,
    state: &State,
    loss: f32,
    faults: &Faults,
) -> Result<PathBuf> {
    let step = state.step;
    let tmp = root.join(format!(".tmp-{step}"));
    let dst = root.join(step.to_string());
    if tmp.exists() {
        // Left by a crash mid-checkpoint; never published, so never read.
        fs::remove_dir_all(&tmp).with_context(|| format!("removing {}", tmp.display()))?;
    }
    fs::create_dir_all(&tmp).with_context(|| format!("creating {}", tmp.display()))?;

    let bytes = encode(hp, state);
    let path = tmp.join("state.bin");
    let mut f = File::create(&path).with_context(|| format!("creating {}", path.display()))?;
    let (first, rest) = bytes.split_at(bytes.len() / 2);
    f.write_all(first)
        .with_context(|| format!("writing {}", path.display()))?;
    if faults.crash {
        std::process::abort();
    }
    std::thread::sleep(faults.delay);
    f.write_all(rest)
        .and_then(|()| f.sync_all())
        .with_context(|| format!("writing {}", path.display()))?;
    drop(f);

    let meta = Meta {
        step,
        loss,
        format: "frugal-example-trainer state.bin v1",
        params: state.params.len(),
        hparams: hp,
    };
    let mut json = serde_json::to_vec_pretty(&meta)?;
    json.push(b'\n');
    write_synced(&tmp.join("meta.json"), &json)?;
    sync_dir(&tmp)?;

    // A directory cannot be renamed over a non-empty one: move the old one aside first.
    if dst.exists() {
        let old = root.join(format!(".old-{step}"));
        if old.exists() {
            fs::remove_dir_all(&old)?;
        }
        fs::rename(&dst, &old).with_context(|| format!("moving {} aside", dst.display()))?;
        fs::rename(&tmp, &dst).with_context(|| format!("publishing {}", dst.display()))?;
        fs::remove_dir_all(&old).with_context(|| format!("removing {}", old.display()))?;
    } else {
        fs::rename(&tmp, &dst).with_context(|| format!("publishing {}", dst.display()))?;
    }
    sync_dir(root)?;
    Ok(dst)
}

/// Writes the model file atomically: a temporary file beside it, fsynced, then renamed.
pub fn write_model(path: &Path, hp: &HParams, vocab: &[u8], params: &[f32]) -> Result<()> {
    let mut buf = Vec::with_capacity(32 + vocab.len() + 4 * params.len());
    buf.extend_from_slice(MODEL_MAGIC);
    put_u32(&mut buf, MODEL_VERSION);
    for x in [hp.vocab, hp.context, hp.embed, hp.hidden] {
        put_u32(&mut buf, u32::try_from(x)?);
    }
    buf.extend_from_slice(vocab);
    put_f32s(&mut buf, params);
    let buf = seal(buf);

    let name = path
        .file_name()
        .with_context(|| format!("--out {} names no file", path.display()))?;
    let mut tmp_name = std::ffi::OsString::from(".");
    tmp_name.push(name);
    tmp_name.push(".tmp");
    let tmp = path.with_file_name(tmp_name);
    write_synced(&tmp, &buf)?;
    fs::rename(&tmp, path).with_context(|| format!("renaming to {}", path.display()))?;
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    sync_dir(parent)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hp() -> HParams {
        HParams {
            vocab: 3,
            context: 2,
            embed: 2,
            hidden: 3,
            batch: 4,
            seed: 5,
            lr: 3e-3,
            data_hash: 0xdead_beef,
        }
    }

    fn state(hp: &HParams) -> State {
        let n = hp.n_params();
        State {
            step: 42,
            params: (0..n).map(|i| i as f32 * 0.25 - 1.0).collect(),
            m: (0..n).map(|i| i as f32 * 1e-3).collect(),
            v: (0..n).map(|i| -(i as f32)).collect(),
        }
    }

    #[test]
    fn save_load_round_trip() {
        let (hp, s) = (hp(), state(&hp()));
        let root = tempfile::tempdir().unwrap();
        let dir = save(root.path(), &hp, &s, 2.5, &Faults::default()).unwrap();
        assert_eq!(dir, root.path().join("42"));
        assert_eq!(load(&dir, &hp).unwrap(), s);
        let meta: serde_json::Value =
            serde_json::from_slice(&fs::read(dir.join("meta.json")).unwrap()).unwrap();
        assert_eq!(meta["step"], 42);
        assert_eq!(meta["hparams"]["hidden"], 3);

        // Saving the same step again replaces it, leaving nothing else behind.
        let mut s2 = s.clone();
        s2.params[0] = 7.0;
        save(root.path(), &hp, &s2, 2.0, &Faults::default()).unwrap();
        assert_eq!(load(&dir, &hp).unwrap(), s2);
        let names: Vec<_> = fs::read_dir(root.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert_eq!(names, ["42"]);
    }

    #[test]
    fn corrupt_checkpoints_are_rejected() {
        let (hp, s) = (hp(), state(&hp()));
        let good = encode(&hp, &s);
        assert_eq!(decode(&good, &hp).unwrap(), s);
        let err = |bytes: &[u8], hp: &HParams| format!("{:#}", decode(bytes, hp).unwrap_err());

        for i in [0, 9, 20, good.len() / 2, good.len() - 1] {
            let mut bad = good.clone();
            bad[i] ^= 0x10;
            let e = err(&bad, &hp);
            assert!(
                e.contains("magic") || e.contains("corrupt"),
                "byte {i}: {e}"
            );
        }
        for len in [0, 5, 16, good.len() / 2, good.len() - 1] {
            let e = err(&good[..len], &hp);
            assert!(e.contains("truncated"), "length {len}: {e}");
        }
        let other = HParams { hidden: 4, ..hp };
        let e = err(&good, &other);
        assert!(e.contains("hidden: checkpoint 3, run 4"), "{e}");

        let root = tempfile::tempdir().unwrap();
        let e = format!("{:#}", load(&root.path().join("7"), &hp).unwrap_err());
        assert!(e.contains("state.bin"), "{e}");
    }

    #[test]
    fn model_file_is_written_atomically() {
        let hp = hp();
        let dir = tempfile::tempdir().unwrap();
        let out = dir.path().join("model.bin");
        let params = state(&hp).params;
        write_model(&out, &hp, b"abc", &params).unwrap();
        let bytes = fs::read(&out).unwrap();
        let body = unseal(&bytes, MODEL_MAGIC, "model").unwrap();
        assert_eq!(body.len(), 4 * 5 + 3 + 4 * params.len());
        assert_eq!(fs::read_dir(dir.path()).unwrap().count(), 1);
    }
}
