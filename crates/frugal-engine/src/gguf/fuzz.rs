//! Fuzz targets of the GGUF reader: the real model's header, cut and mutated, and a small
//! file rebuilt from it whose every count, length, dimension and offset is set to values a
//! corrupt or hostile file could hold. Each must parse into tensors that lie within the file
//! or fail with an error, allocating no more than the file's size allows.

use std::sync::OnceLock;

use proptest::collection::vec;
use proptest::prelude::*;

use super::testutil::{GgufBuilder, test_model};
use super::types::vtype;
use super::*;
use crate::model::{LoadOptions, Model};
use frugal_testkit::fuzz::{Mutation, capped, cases, mutate};

/// Single allocations past this fail the target: a header of a megabyte needs far less.
const CAP: usize = 64 << 20;

/// The real model's first 256 KiB: magic, counts and the metadata up to the vocabulary.
fn real_prefix() -> &'static [u8] {
    &test_model().bytes()[..256 << 10]
}

/// A whole, valid file built from the real model: all its metadata (arrays cut to 32
/// items) and three of its tensors, rows cut short, in their own types.
fn small_real() -> &'static [u8] {
    static FILE: OnceLock<Vec<u8>> = OnceLock::new();
    FILE.get_or_init(|| {
        let g = test_model();
        let mut b = GgufBuilder::new();
        for (k, v) in &g.metadata {
            let v = match v {
                Value::Array(items) => Value::Array(items.iter().take(32).cloned().collect()),
                v => v.clone(),
            };
            b = b.kv(k, v);
        }
        for name in [
            "output_norm.weight",
            "blk.0.attn_q.weight",
            "blk.0.ffn_down.weight",
        ] {
            let t = g.tensor(name).unwrap();
            let dims: Vec<u64> = match t.dims {
                [n] => vec![*n],
                [cols, _] => vec![*cols, 2],
                other => panic!("{other:?}"),
            };
            let rows = if dims.len() == 2 { 2 } else { 1 };
            let len = t.data.len() / t.dims.get(1).copied().unwrap_or(1) as usize * rows;
            b = b.tensor(name, &dims, t.dtype.id(), t.data[..len].to_vec());
        }
        let file = b.build();
        assert!(parse_layout(&file).is_ok());
        file
    })
}

/// Parses `buf` as `Gguf::parse` does, capped; a parsed file's tensors must all be there.
fn check(buf: &[u8]) -> Result<(), TestCaseError> {
    let (parsed, peak) = capped(CAP, buf, || Gguf::parse(buf.to_vec()));
    // The copy `Gguf::parse` owns, and at most tens of bytes per byte of metadata.
    prop_assert!(
        peak <= 64 * buf.len() + (1 << 20),
        "{peak} bytes for {}",
        buf.len()
    );
    match parsed {
        Ok(g) => {
            for info in &g.tensors {
                let t = g
                    .tensor(&info.name)
                    .map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(t.data.len() as u64, info.n_bytes());
            }
        }
        Err(e) => prop_assert!(!e.to_string().is_empty()),
    }
    Ok(())
}

const DICT: &[&[u8]] = &[
    b"GGUF",
    b"\x03\0\0\0",
    b"\0\0\0\0",
    b"\xff\xff\xff\xff",
    b"\x09\0\0\0",
    b"\x08\0\0\0",
    b"general.alignment",
    b"tokenizer.ggml.tokens",
    b"\xc3",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases("fuzz_gguf_mutated_header", 300)))]

    /// The real header and the small real file, cut and mutated byte by byte (bit flips,
    /// huge integers written over fields, ranges deleted or repeated).
    #[test]
    fn fuzz_gguf_mutated_header(small in any::<bool>(), m in vec(any::<Mutation>(), 1..6)) {
        let seed = if small { small_real() } else { real_prefix() };
        check(&mutate(seed, &m, DICT))?;
    }
}

/// (offset, width in bytes) of each field found.
type Fields = Vec<(usize, usize)>;

/// Where each count, length, type, dimension and offset of a GGUF header is. Walks a valid
/// file.
fn fields(buf: &[u8]) -> Fields {
    let u32_at = |at: usize| u32::from_le_bytes(buf[at..at + 4].try_into().unwrap());
    let u64_at = |at: usize| u64::from_le_bytes(buf[at..at + 8].try_into().unwrap()) as usize;
    let mut out = vec![(4, 4), (8, 8), (16, 8)];
    let n_tensors = u64_at(8);
    let n_kv = u64_at(16);
    let mut at = 24;
    let string = |at: &mut usize, out: &mut Fields| {
        out.push((*at, 8));
        *at += 8 + u64_at(*at);
    };
    fn value(
        buf: &[u8],
        t: u32,
        at: &mut usize,
        out: &mut Fields,
        string: &dyn Fn(&mut usize, &mut Fields),
    ) {
        match t {
            vtype::STRING => string(at, out),
            vtype::ARRAY => {
                let elem = u32::from_le_bytes(buf[*at..*at + 4].try_into().unwrap());
                out.push((*at, 4));
                out.push((*at + 4, 8));
                let n = u64::from_le_bytes(buf[*at + 4..*at + 12].try_into().unwrap());
                *at += 12;
                for _ in 0..n {
                    value(buf, elem, at, out, string);
                }
            }
            t => *at += vtype::min_size(t).unwrap(),
        }
    }
    for _ in 0..n_kv {
        string(&mut at, &mut out);
        let t = u32_at(at);
        out.push((at, 4));
        at += 4;
        value(buf, t, &mut at, &mut out, &string);
    }
    for _ in 0..n_tensors {
        string(&mut at, &mut out);
        let n_dims = u32_at(at) as usize;
        out.push((at, 4));
        at += 4;
        for _ in 0..n_dims {
            out.push((at, 8));
            at += 8;
        }
        out.push((at, 4));
        out.push((at + 4, 8));
        at += 12;
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases("fuzz_gguf_huge_fields", 400)))]

    /// One or two of the small real file's counts, lengths, types, dimensions or offsets
    /// set to a huge, zero, off-by-one or file-sized value.
    #[test]
    fn fuzz_gguf_huge_fields(
        picks in vec((any::<prop::sample::Index>(), 0usize..12), 1..3),
    ) {
        let mut buf = small_real().to_vec();
        let fields = fields(&buf);
        for (field, how) in &picks {
            let (at, width) = fields[field.index(fields.len())];
            let old = if width == 4 {
                u64::from(u32::from_le_bytes(buf[at..at + 4].try_into().unwrap()))
            } else {
                u64::from_le_bytes(buf[at..at + 8].try_into().unwrap())
            };
            let len = buf.len() as u64;
            let v = [
                0, 1, old.wrapping_add(1), old.wrapping_sub(1), old.wrapping_mul(2), len,
                len.wrapping_sub(at as u64), u64::from(u32::MAX), 1 << 32, 1 << 40,
                i64::MAX as u64, u64::MAX,
            ][*how];
            buf[at..at + width].copy_from_slice(&v.to_le_bytes()[..width]);
        }
        check(&buf)?;
    }
}

/// The real model with each of its shape keys set to a huge or degenerate value loads or
/// fails with an error, never an allocation sized by the bogus key. Found that
/// `llama.block_count = 2147483648` reserved 773 GB for the layers and aborted.
#[test]
fn fuzz_gguf_model_config() {
    let keys = [
        "block_count",
        "embedding_length",
        "attention.head_count",
        "attention.head_count_kv",
        "feed_forward_length",
        "context_length",
        "vocab_size",
    ];
    for key in keys {
        for value in [0u32, 1 << 31, u32::MAX] {
            let mut g = Gguf::parse(test_model().bytes().to_vec()).unwrap();
            g.metadata.insert(format!("llama.{key}"), Value::U32(value));
            // The model's own matrices are tens of megabytes; an allocation sized by the
            // key would be gigabytes.
            let what = format!("llama.{key} = {value}");
            let (loaded, _) = capped(1 << 30, what.as_bytes(), || {
                Model::from_gguf(&g, LoadOptions::default()).map(|_| ())
            });
            if let Err(e) = loaded {
                assert!(!e.to_string().is_empty());
            }
        }
    }
}
