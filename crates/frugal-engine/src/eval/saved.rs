//! A reference model's top-k log-probabilities per scored token, saved once so later
//! evaluations read a few MB instead of running the reference again.
//!
//! Layout, little-endian: the 8-byte magic, then `vocab`, `k`, `ctx`, `chunks` (u32 each), the
//! vocabulary hash and the tokens hash (32 bytes each); then per scored token the reference's
//! NLL of the text's next token (f32) and its top k as (id u32, log-probability f32), most
//! likely first; then the SHA-256 of everything before it. Written to a temporary name and
//! renamed, so a file under the final name is whole.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::{EvalError, scored_per_chunk, short_hex};

const MAGIC: &[u8; 8] = b"FRGLREF1";
const HEADER: usize = 8 + 4 * 4 + 32 + 32;

/// Whether `path` is a saved reference rather than a GGUF (the file a live reference loads).
pub fn is_saved_reference(path: &Path) -> bool {
    let mut magic = [0u8; 4];
    let read = File::open(path).and_then(|mut f| std::io::Read::read_exact(&mut f, &mut magic));
    read.is_ok() && &magic != b"GGUF"
}

/// What a saved reference was made on, checked before it is read.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Made {
    pub vocab: u32,
    pub k: u32,
    pub ctx: u32,
    pub chunks: u32,
    pub vocab_hash: [u8; 32],
    pub tokens_hash: [u8; 32],
}

impl Made {
    fn tokens(&self) -> usize {
        self.chunks as usize * scored_per_chunk(self.ctx as usize)
    }

    fn record(&self) -> usize {
        4 + 8 * self.k as usize
    }

    fn encode(&self) -> Vec<u8> {
        let mut b = Vec::with_capacity(HEADER);
        b.extend_from_slice(MAGIC);
        for v in [self.vocab, self.k, self.ctx, self.chunks] {
            b.extend_from_slice(&v.to_le_bytes());
        }
        b.extend_from_slice(&self.vocab_hash);
        b.extend_from_slice(&self.tokens_hash);
        b
    }
}

fn io(path: &Path) -> impl FnOnce(std::io::Error) -> EvalError + '_ {
    move |source| EvalError::Io {
        path: path.display().to_string(),
        source,
    }
}

/// Writes a saved reference as the evaluation goes.
pub struct SavedWriter {
    path: PathBuf,
    tmp: PathBuf,
    out: BufWriter<File>,
    hash: Sha256,
    made: Made,
    written: usize,
}

impl SavedWriter {
    pub fn create(path: &Path, made: Made) -> Result<SavedWriter, EvalError> {
        let mut name = path.file_name().unwrap_or_default().to_os_string();
        name.push(".partial");
        let tmp = path.with_file_name(name);
        let out = BufWriter::new(File::create(&tmp).map_err(io(&tmp))?);
        let mut w = SavedWriter {
            path: path.to_owned(),
            tmp,
            out,
            hash: Sha256::new(),
            made,
            written: 0,
        };
        w.write(&made.encode())?;
        Ok(w)
    }

    fn write(&mut self, bytes: &[u8]) -> Result<(), EvalError> {
        self.hash.update(bytes);
        self.out.write_all(bytes).map_err(io(&self.tmp))
    }

    /// The next scored token: the reference's NLL of the actual next token, and its top k.
    pub fn push(&mut self, nll: f32, top: &[(u32, f32)]) -> Result<(), EvalError> {
        if top.len() != self.made.k as usize {
            return Err(EvalError::Mismatch {
                what: format!("with top {} but {} were given", self.made.k, top.len()),
            });
        }
        let mut rec = Vec::with_capacity(self.made.record());
        rec.extend_from_slice(&nll.to_le_bytes());
        for &(id, lp) in top {
            rec.extend_from_slice(&id.to_le_bytes());
            rec.extend_from_slice(&lp.to_le_bytes());
        }
        self.write(&rec)?;
        self.written += 1;
        Ok(())
    }

    /// Seals the file (hash, flush, fsync) and moves it to its name.
    pub fn finish(&mut self) -> Result<(), EvalError> {
        if self.written != self.made.tokens() {
            return Err(EvalError::Mismatch {
                what: format!(
                    "for {} tokens but {} were scored",
                    self.made.tokens(),
                    self.written
                ),
            });
        }
        let digest: [u8; 32] = std::mem::take(&mut self.hash).finalize().into();
        self.out.write_all(&digest).map_err(io(&self.tmp))?;
        self.out.flush().map_err(io(&self.tmp))?;
        self.out.get_ref().sync_all().map_err(io(&self.tmp))?;
        std::fs::rename(&self.tmp, &self.path).map_err(io(&self.path))
    }
}

impl Drop for SavedWriter {
    fn drop(&mut self) {
        // Unfinished (an error mid-run): leave no partial file behind.
        if self.tmp.exists() {
            let _ = std::fs::remove_file(&self.tmp);
        }
    }
}

/// A saved reference, checked whole when opened and read token by token.
pub struct SavedReference {
    made: Made,
    body: Vec<u8>,
    at: usize,
    path: String,
}

impl SavedReference {
    /// The file at `path`, which must have been made on `expect` (its `k` is taken from the
    /// file).
    pub fn open(path: &Path, expect: Made) -> Result<SavedReference, EvalError> {
        let bytes = std::fs::read(path).map_err(io(path))?;
        let name = path.display().to_string();
        let corrupt = |why: String| EvalError::Corrupt {
            path: name.clone(),
            why,
        };
        if bytes.len() < HEADER + 32 || &bytes[..8] != MAGIC {
            return Err(corrupt(
                "not a saved reference (made by `frugal eval ppl --save-reference FILE`)".into(),
            ));
        }
        let u32_at =
            |i: usize| u32::from_le_bytes([bytes[i], bytes[i + 1], bytes[i + 2], bytes[i + 3]]);
        let hash_at = |i: usize| -> [u8; 32] {
            let mut h = [0; 32];
            h.copy_from_slice(&bytes[i..i + 32]);
            h
        };
        let made = Made {
            vocab: u32_at(8),
            k: u32_at(12),
            ctx: u32_at(16),
            chunks: u32_at(20),
            vocab_hash: hash_at(24),
            tokens_hash: hash_at(56),
        };
        let want = if made.ctx >= 4 {
            HEADER + made.tokens() * made.record() + 32
        } else {
            0
        };
        if bytes.len() != want {
            return Err(corrupt(format!(
                "{} bytes where its header promises {want}: truncated or damaged",
                bytes.len()
            )));
        }
        let (content, digest) = bytes.split_at(bytes.len() - 32);
        if Sha256::digest(content).as_slice() != digest {
            return Err(corrupt(
                "its checksum does not match: the file is damaged".into(),
            ));
        }
        if made.vocab != expect.vocab || made.vocab_hash != expect.vocab_hash {
            return Err(EvalError::Vocabulary {
                model: expect.vocab as usize,
                model_hash: short_hex(&expect.vocab_hash),
                reference: made.vocab as usize,
                reference_hash: short_hex(&made.vocab_hash),
            });
        }
        if (made.ctx, made.chunks, made.tokens_hash)
            != (expect.ctx, expect.chunks, expect.tokens_hash)
        {
            return Err(EvalError::Mismatch {
                what: format!(
                    "on other input ({} chunks of {} tokens, text {}) than this run's ({} chunks of {}, text {}): pass the same --text, --ctx and --chunks",
                    made.chunks,
                    made.ctx,
                    short_hex(&made.tokens_hash),
                    expect.chunks,
                    expect.ctx,
                    short_hex(&expect.tokens_hash)
                ),
            });
        }
        let mut body = bytes;
        body.truncate(body.len() - 32);
        Ok(SavedReference {
            made,
            body,
            at: HEADER,
            path: name,
        })
    }

    /// The log-probabilities kept per token.
    pub fn k(&self) -> usize {
        self.made.k as usize
    }

    /// The next scored token's reference NLL and top k.
    pub fn next_token(&mut self) -> Result<(f32, Vec<(u32, f32)>), EvalError> {
        let end = self.at + self.made.record();
        let Some(rec) = self.body.get(self.at..end) else {
            return Err(EvalError::Corrupt {
                path: self.path.clone(),
                why: "holds fewer tokens than this run scores".into(),
            });
        };
        let word = |i: usize| [rec[i], rec[i + 1], rec[i + 2], rec[i + 3]];
        let nll = f32::from_le_bytes(word(0));
        let top = (0..self.made.k as usize)
            .map(|j| {
                let i = 4 + 8 * j;
                (u32::from_le_bytes(word(i)), f32::from_le_bytes(word(i + 4)))
            })
            .collect();
        self.at = end;
        Ok((nll, top))
    }

    /// Checks that every saved token was read.
    pub fn finish(&self) -> Result<(), EvalError> {
        if self.at == self.body.len() {
            Ok(())
        } else {
            Err(EvalError::Corrupt {
                path: self.path.clone(),
                why: "holds more tokens than this run scored".into(),
            })
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn made(k: u32) -> Made {
        Made {
            vocab: 10,
            k,
            ctx: 8,
            chunks: 2,
            vocab_hash: [1; 32],
            tokens_hash: [2; 32],
        }
    }

    fn write(path: &Path, m: Made) {
        let mut w = SavedWriter::create(path, m).unwrap();
        for t in 0..m.tokens() {
            let top: Vec<(u32, f32)> = (0..m.k).map(|j| (j, -(t as f32) - j as f32)).collect();
            w.push(t as f32, &top).unwrap();
        }
        w.finish().unwrap();
    }

    #[test]
    fn round_trips_and_refuses_damage_and_other_input() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ref.bin");
        write(&path, made(3));
        let mut r = SavedReference::open(&path, made(3)).unwrap();
        assert_eq!(r.k(), 3);
        for t in 0..made(3).tokens() {
            let (nll, top) = r.next_token().unwrap();
            assert_eq!(nll, t as f32);
            assert_eq!(top[2], (2, -(t as f32) - 2.0));
        }
        r.finish().unwrap();
        assert!(r.next_token().is_err());

        let mut other = made(3);
        other.vocab_hash = [9; 32];
        let e = SavedReference::open(&path, other)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("another vocabulary"), "{e}");
        other = made(3);
        other.tokens_hash = [7; 32];
        let e = SavedReference::open(&path, other)
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("same --text"), "{e}");

        let mut bytes = std::fs::read(&path).unwrap();
        bytes[HEADER + 5] ^= 1;
        std::fs::write(&path, &bytes).unwrap();
        let e = SavedReference::open(&path, made(3))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("checksum"), "{e}");
        std::fs::write(&path, &bytes[..bytes.len() - 9]).unwrap();
        let e = SavedReference::open(&path, made(3))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("truncated"), "{e}");
        std::fs::write(&path, b"hello").unwrap();
        let e = SavedReference::open(&path, made(3))
            .err()
            .unwrap()
            .to_string();
        assert!(e.contains("not a saved reference"), "{e}");
    }

    #[test]
    fn an_unfinished_writer_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("ref.bin");
        {
            let mut w = SavedWriter::create(&path, made(2)).unwrap();
            w.push(1.0, &[(0, -0.1), (1, -2.0)]).unwrap();
            assert!(w.finish().is_err(), "too few tokens");
        }
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0);
    }
}
