use super::testutil::*;
use super::*;

/// splitmix64: a tiny seeded generator so the corruption test is reproducible.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[test]
fn real_model_header() {
    let g = test_model();
    assert_eq!(g.version, 3);
    assert_eq!(g.metadata.len(), 33);
    assert_eq!(g.tensors.len(), 272);
    assert_eq!(g.architecture().unwrap(), "llama");
    assert_eq!(g.str("tokenizer.ggml.model").unwrap(), "gpt2");
    assert_eq!(g.str("tokenizer.ggml.pre").unwrap(), "smollm");
    assert_eq!(g.str_array("tokenizer.ggml.tokens").unwrap().len(), 49152);
    let types = g.i32_array("tokenizer.ggml.token_type").unwrap();
    assert_eq!(types.len(), 49152);
    assert!(types.contains(&3));
    let merges = g.str_array("tokenizer.ggml.merges").unwrap();
    assert_eq!(merges.len(), 48900);
    assert!(merges.iter().all(|m| m.split(' ').count() == 2));
    assert_eq!(g.u32("tokenizer.ggml.bos_token_id").unwrap(), 1);
    assert_eq!(g.u32("tokenizer.ggml.eos_token_id").unwrap(), 2);
    assert_eq!(g.u32("tokenizer.ggml.unknown_token_id").unwrap(), 0);
    assert_eq!(g.u32("tokenizer.ggml.padding_token_id").unwrap(), 2);
    assert!(!g.bool("tokenizer.ggml.add_bos_token").unwrap());
    assert!(
        g.str("tokenizer.chat_template")
            .unwrap()
            .contains("<|im_start|>")
    );
    assert_eq!(g.alignment(), 32);
    assert_eq!(g.data_offset() % 32, 0);
    assert!(g.path().is_some());

    let mut seen = std::collections::BTreeSet::new();
    for info in &g.tensors {
        seen.insert(info.dtype);
        let t = g.tensor(&info.name).unwrap();
        assert_eq!(t.data.len() as u64, info.n_bytes(), "{}", info.name);
        assert_eq!(t.dims, &info.dims[..]);
    }
    let seen: Vec<_> = seen.into_iter().collect();
    assert_eq!(seen, [GgmlType::F32, GgmlType::Q4_1, GgmlType::Q8_0]);
    // The last tensor ends within the file, no earlier than the last alignment boundary.
    let end = g
        .tensors
        .iter()
        .map(|t| g.data_offset() as u64 + t.offset + t.n_bytes())
        .max()
        .unwrap();
    assert!(end <= g.bytes().len() as u64);
    assert!(g.bytes().len() as u64 - end < 32);
}

#[test]
fn real_model_tensor_shapes() {
    let g = test_model();
    let n_embd = g.u32("llama.embedding_length").unwrap() as u64;
    let n_vocab = 49152;
    let emb = g.tensor("token_embd.weight").unwrap();
    assert_eq!(emb.dims, &[n_embd, n_vocab]);
    let norm = g.tensor("output_norm.weight").unwrap();
    assert_eq!(norm.dtype, GgmlType::F32);
    assert_eq!(norm.dims, &[n_embd]);
    assert_eq!(norm.data.len() as u64, n_embd * 4);
    assert_eq!(g.u32("llama.block_count").unwrap(), 30);
    assert!(g.f32("llama.rope.freq_base").unwrap() > 0.0);
    assert!(g.f32("llama.attention.layer_norm_rms_epsilon").unwrap() > 0.0);
}

#[test]
fn getter_errors_name_key_and_type() {
    let g = test_model();
    let e = g.u32("no.such.key").unwrap_err();
    let msg = e.to_string();
    assert!(
        msg.contains("no.such.key") && msg.contains("missing"),
        "{msg}"
    );
    assert!(msg.contains("SmolLM2"), "path missing from {msg}");
    assert!(matches!(e.kind(), GgufError::MissingKey(_)));
    let msg = g.u32("general.architecture").unwrap_err().to_string();
    assert!(
        msg.contains("general.architecture") && msg.contains("string"),
        "{msg}"
    );
    let msg = g.str("llama.block_count").unwrap_err().to_string();
    assert!(msg.contains("expected string"), "{msg}");
    let msg = g
        .str_array("tokenizer.ggml.token_type")
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("array of string") && msg.contains("array of i32"),
        "{msg}"
    );
    assert_eq!(g.opt_u32("no.such.key").unwrap(), None);
    assert!(g.opt_u32("general.architecture").is_err());
    let msg = g.tensor("nope.weight").unwrap_err().to_string();
    assert!(msg.contains("nope.weight"), "{msg}");
}

#[test]
fn truncated_copies_error_without_panicking() {
    let g = test_model();
    let bytes = g.bytes();
    let len = bytes.len();
    let data = g.data_offset();
    let mut cuts = vec![0, 1, 3, 4, 7, 8, 12, 16, 20, 24, 30, 40, 100, 1000];
    // Inside the metadata (the vocabulary array is large), the tensor infos and the data.
    cuts.extend([50_000, 300_000, 700_000]);
    cuts.extend([
        data - 5000,
        data - 1000,
        data - 100,
        data - 1,
        data,
        data + 1,
    ]);
    cuts.extend([data + 1_000_000, len / 2, len - 1000, len - 1]);
    assert!(cuts.len() >= 20);
    for cut in cuts {
        let e = Gguf::parse(bytes[..cut].to_vec())
            .err()
            .unwrap_or_else(|| panic!("cut at {cut} parsed"));
        let msg = e.to_string();
        assert!(
            msg.contains("truncated") || msg.contains("not a GGUF") || msg.contains("claims"),
            "cut at {cut}: {msg}"
        );
    }
    // A cut in the data names the tensor and the byte range it needed.
    let msg = Gguf::parse(bytes[..len - 1].to_vec())
        .unwrap_err()
        .to_string();
    assert!(
        msg.contains("truncated: tensor ") && msg.contains(&format!("file has {}", len - 1)),
        "{msg}"
    );
}

#[test]
fn corrupted_header_never_panics() {
    let g = test_model();
    // Only the header region matters here, and the data is validated by offset arithmetic
    // alone, so parse a copy of header + a bit of data in place instead of cloning 100 MB
    // per iteration.
    let region = g.bytes().len().min(1 << 20).max(g.data_offset() + 4096);
    let mut buf = g.bytes().to_vec();
    let mut rng = Rng(0x5eed);
    let (mut ok, mut err) = (0, 0);
    for _ in 0..400 {
        let n = 1 + rng.below(4);
        let mut saved = Vec::new();
        for _ in 0..n {
            // Bias half the flips to the first 4 KiB, where the counts and lengths live.
            let span = if rng.below(2) == 0 { 4096 } else { region };
            let pos = rng.below(span.min(buf.len()));
            saved.push((pos, buf[pos]));
            buf[pos] ^= 1 << rng.below(8);
            if rng.below(4) == 0 {
                buf[pos] = rng.next() as u8;
            }
        }
        match parse_layout(&buf) {
            Ok(_) => ok += 1,
            Err(e) => {
                let _ = e.to_string();
                err += 1;
            }
        }
        for (pos, b) in saved.into_iter().rev() {
            buf[pos] = b;
        }
    }
    assert!(err > 0, "no corruption was detected (ok={ok})");
    assert!(parse_layout(&buf).is_ok());
}

#[test]
fn bad_magic_and_version() {
    let e = Gguf::parse(b"GGML\x03\0\0\0".to_vec()).unwrap_err();
    assert!(e.to_string().contains("not a GGUF file"), "{e}");
    let e = Gguf::parse(Vec::new()).unwrap_err();
    assert!(e.to_string().contains("not a GGUF file"), "{e}");
    let mut b = GgufBuilder::new();
    b.version = 1;
    let e = Gguf::parse(b.build()).unwrap_err();
    assert!(e.to_string().contains("unsupported GGUF version 1"), "{e}");
    let mut bytes = GgufBuilder::new().build();
    bytes[4..8].copy_from_slice(&3u32.to_be_bytes());
    let e = Gguf::parse(bytes).unwrap_err();
    assert!(e.to_string().contains("big-endian"), "{e}");
    // Opening a non-GGUF file names it.
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("model.bin");
    std::fs::write(&p, b"hello world").unwrap();
    let e = Gguf::open(&p).unwrap_err();
    assert!(
        e.to_string().contains("model.bin") && e.to_string().contains("not a GGUF"),
        "{e}"
    );
    let e = Gguf::open(dir.path().join("missing.gguf")).unwrap_err();
    assert!(matches!(e, GgufError::Io { .. }) && e.to_string().contains("missing.gguf"));
}

#[test]
fn handbuilt_roundtrips_every_value_type() {
    let kvs = vec![
        ("t.u8", Value::U8(200)),
        ("t.i8", Value::I8(-100)),
        ("t.u16", Value::U16(60_000)),
        ("t.i16", Value::I16(-30_000)),
        ("t.u32", Value::U32(4_000_000_000)),
        ("t.i32", Value::I32(-2_000_000_000)),
        ("t.u64", Value::U64(u64::MAX)),
        ("t.i64", Value::I64(i64::MIN)),
        ("t.f32", Value::F32(1.5)),
        ("t.f64", Value::F64(-2.25e300)),
        ("t.bool", Value::Bool(true)),
        ("t.string", Value::String("héllo 🙂".to_owned())),
        (
            "t.strs",
            Value::Array(vec![Value::String("a".into()), Value::String("".into())]),
        ),
        ("t.ints", Value::Array(vec![Value::I32(1), Value::I32(-3)])),
        ("t.u8s", Value::Array(vec![Value::U8(1), Value::U8(3)])),
        ("t.empty", Value::Array(vec![])),
        (
            "t.nested",
            Value::Array(vec![
                Value::Array(vec![Value::F32(0.5)]),
                Value::Array(vec![]),
            ]),
        ),
    ];
    let mut b = GgufBuilder::new();
    for (k, v) in &kvs {
        b = b.kv(k, v.clone());
    }
    let data: Vec<u8> = (0..16)
        .flat_map(|i: u32| (i as f32).to_le_bytes())
        .collect();
    let q8: Vec<u8> = vec![7; 34 * 2];
    b = b
        .tensor("a", &[4, 4], 0, data.clone())
        .tensor("b", &[64], 8, q8.clone());
    let g = Gguf::parse(b.build()).unwrap();
    assert_eq!(g.metadata.len(), kvs.len());
    for (k, v) in &kvs {
        assert_eq!(g.get(k), Some(v), "{k}");
    }
    assert_eq!(g.u32("t.u8").unwrap(), 200);
    assert_eq!(g.u32("t.u16").unwrap(), 60_000);
    assert_eq!(g.i64("t.i8").unwrap(), -100);
    assert!(
        g.u32("t.i8")
            .unwrap_err()
            .to_string()
            .contains("does not fit in u32")
    );
    assert!(g.u32("t.u64").is_err());
    assert_eq!(g.u64("t.u64").unwrap(), u64::MAX);
    assert_eq!(g.f32("t.f32").unwrap(), 1.5);
    assert_eq!(g.f32("t.u8").unwrap(), 200.0);
    assert!(g.bool("t.bool").unwrap());
    assert_eq!(g.str("t.string").unwrap(), "héllo 🙂");
    assert_eq!(g.str_array("t.strs").unwrap(), ["a", ""]);
    assert_eq!(g.i32_array("t.ints").unwrap(), [1, -3]);
    assert_eq!(g.i32_array("t.u8s").unwrap(), [1, 3]);
    assert_eq!(g.str_array("t.empty").unwrap(), Vec::<&str>::new());
    assert_eq!(g.opt_str("t.absent").unwrap(), None);

    let a = g.tensor("a").unwrap();
    assert_eq!(
        (a.dims, a.dtype, a.data),
        (&[4u64, 4][..], GgmlType::F32, &data[..])
    );
    assert_eq!(a.n_elements(), 16);
    let t = g.tensor("b").unwrap();
    assert_eq!((t.dtype, t.data), (GgmlType::Q8_0, &q8[..]));
    assert_eq!(g.tensor_info("b").unwrap().offset, 64);
    assert_eq!(g.data_offset() % 32, 0);
}

#[test]
fn custom_alignment() {
    let b = GgufBuilder::new()
        .kv("general.alignment", Value::U32(64))
        .tensor("x", &[3], 0, vec![1; 12])
        .tensor("y", &[2], 1, vec![2; 4]);
    let g = Gguf::parse(b.build()).unwrap();
    assert_eq!(g.alignment(), 64);
    assert_eq!(g.data_offset() % 64, 0);
    assert_eq!(g.tensor_info("y").unwrap().offset, 64);
    assert_eq!(g.tensor("y").unwrap().data, &[2; 4]);
    let b = GgufBuilder::new().kv("general.alignment", Value::U32(48));
    assert!(matches!(
        Gguf::parse(b.build()),
        Err(GgufError::BadAlignment(48))
    ));
}

#[test]
fn malformed_tensors_are_errors() {
    let f32s = |n: usize| vec![0u8; n * 4];
    let err = |b: GgufBuilder| Gguf::parse(b.build()).unwrap_err().to_string();

    let msg = err(GgufBuilder::new().tensor("w", &[8], 77, f32s(8)));
    assert!(
        msg.contains("unknown ggml type id 77") && msg.contains("\"w\""),
        "{msg}"
    );
    let msg = err(GgufBuilder::new()
        .tensor("w", &[2], 0, f32s(2))
        .tensor("w", &[2], 0, f32s(2)));
    assert!(msg.contains("duplicate tensor name \"w\""), "{msg}");
    let msg = err(GgufBuilder::new().tensor("q", &[48, 2], 3, vec![0; 20 * 3]));
    assert!(
        msg.contains("not a multiple") && msg.contains("q4_1"),
        "{msg}"
    );
    let msg = err(GgufBuilder::new().tensor("big", &[8], 0, f32s(4)));
    assert!(msg.contains("truncated: tensor big needs bytes"), "{msg}");
    let msg = err(GgufBuilder::new().tensor("o", &[u64::MAX, 4], 0, vec![]));
    assert!(msg.contains("overflow"), "{msg}");
    let msg = err(GgufBuilder::new().tensor("d", &[1, 1, 1, 1, 1], 0, f32s(1)));
    assert!(msg.contains("5 dimensions"), "{msg}");
    // Absurd counts are errors before any allocation.
    let mut bytes = GgufBuilder::new()
        .kv("k", Value::Array(vec![Value::U64(1)]))
        .build();
    let count_at = bytes.len() - 16;
    bytes[count_at..count_at + 8].copy_from_slice(&u64::MAX.to_le_bytes());
    let msg = Gguf::parse(bytes).unwrap_err().to_string();
    assert!(msg.contains("claims") && msg.contains("\"k\""), "{msg}");
    let mut bytes = GgufBuilder::new()
        .kv("k", Value::String("abc".into()))
        .build();
    let len_at = bytes.len() - 11;
    bytes[len_at..len_at + 8].copy_from_slice(&(1u64 << 60).to_le_bytes());
    let msg = Gguf::parse(bytes).unwrap_err().to_string();
    assert!(
        msg.contains("claims") && msg.contains("byte offset"),
        "{msg}"
    );
    let mut bytes = GgufBuilder::new().build();
    bytes[8..16].copy_from_slice(&u64::MAX.to_le_bytes());
    assert!(
        Gguf::parse(bytes)
            .unwrap_err()
            .to_string()
            .contains("truncated")
    );
    let msg = err(GgufBuilder::new()
        .kv("k", Value::U8(1))
        .kv("k", Value::U8(2)));
    assert!(msg.contains("duplicate metadata key"), "{msg}");
}
