//! `frugal quantize` end to end: the release binary writes SmolLM2 as Q8_0 and Q4_K, the
//! Python `gguf` package (llama.cpp's own reader) reads the files back, and `frugal serve`
//! answers from one; bad inputs are refused with clear errors and no output.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

mod common;

use std::path::Path;
use std::process::{Command, Output};

use common::{Server, model, said};

fn quantize(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_frugal"))
        .arg("quantize")
        .args(args)
        .output()
        .unwrap()
}

/// python3 with the `gguf` package, or a failure saying how to get it: never a skip.
fn python_gguf() {
    let ok = Command::new("python3")
        .args(["-c", "import gguf"])
        .status()
        .is_ok_and(|s| s.success());
    assert!(
        ok,
        "reading the quantized files needs python3 with the gguf package: \
         python3 -m pip install 'gguf>=0.10' (`make test` installs it)"
    );
}

/// What the `gguf` package reads from `path`: tensor count, each tensor's type name by
/// name, and the string metadata that must survive.
fn read_with_gguf_py(path: &Path) -> serde_json::Value {
    python_gguf();
    let script = r#"
import json, sys
import gguf
r = gguf.GGUFReader(sys.argv[1])
def s(key):
    f = r.fields.get(key)
    return None if f is None else bytes(f.parts[f.data[0]]).decode()
def n(key):
    f = r.fields.get(key)
    return None if f is None else int(f.parts[f.data[0]][0])
tokens = r.fields["tokenizer.ggml.tokens"]
json.dump({
    "tensors": len(r.tensors),
    "types": {t.name: t.tensor_type.name for t in r.tensors},
    "architecture": s("general.architecture"),
    "template": s("tokenizer.chat_template"),
    "tokenizer": s("tokenizer.ggml.model"),
    "vocab": len(tokens.data),
    "token_100": bytes(tokens.parts[tokens.data[100]]).decode(),
    "file_type": n("general.file_type"),
    "quantization_version": n("general.quantization_version"),
}, sys.stdout)
"#;
    let out = Command::new("python3")
        .args(["-c", script])
        .arg(path)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", said(&out));
    serde_json::from_slice(&out.stdout).unwrap()
}

#[test]
fn smollm2_to_q8_0_and_q4_k_read_by_gguf_py_and_served() {
    let dir = tempfile::tempdir().unwrap();
    let input = model();
    let original = read_with_gguf_py(&input);
    for (ty, ggml, file_type) in [("q8_0", "Q8_0", 7), ("q4_k", "Q4_K", 14)] {
        let out_path = dir.path().join(format!("smollm2-{ty}.gguf"));
        let out = quantize(&[
            input.to_str().unwrap(),
            out_path.to_str().unwrap(),
            "--type",
            ty,
            "--json",
        ]);
        assert!(out.status.success(), "{}", said(&out));
        let report: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let size = std::fs::metadata(&out_path).unwrap().len();
        assert_eq!(report["bytes_after"], size);
        assert_eq!(report["source_quantized"], true, "the test model is Q4_1");
        assert_eq!(report["tensors"].as_array().unwrap().len(), 272);

        let read = read_with_gguf_py(&out_path);
        assert_eq!(read["tensors"], original["tensors"]);
        for key in [
            "architecture",
            "template",
            "tokenizer",
            "vocab",
            "token_100",
        ] {
            assert_eq!(read[key], original[key], "{key}");
        }
        assert!(read["template"].as_str().unwrap().contains("im_start"));
        assert_eq!(read["file_type"], file_type);
        assert_eq!(read["quantization_version"], 2);
        let types = read["types"].as_object().unwrap();
        for (name, t) in types {
            let t = t.as_str().unwrap();
            let want = if original["types"][name] == "F32" {
                "F32"
            } else if ty == "q4_k" && !name.ends_with("ffn_down.weight") {
                // Rows of 576 are not whole 256-weight super-blocks: llama.cpp's fallback.
                "Q5_0"
            } else {
                ggml
            };
            assert_eq!(t, want, "{name}");
        }
        if ty == "q4_k" {
            let fallbacks = report["fallbacks"].as_array().unwrap();
            assert_eq!(fallbacks.len(), 30 * 6 + 1, "every matrix but ffn_down");
        }
    }

    // The engine serves the Q4_K file (its own kernels, at its own size) and answers.
    let q4k = dir.path().join("smollm2-q4_k.gguf");
    let server = Server::start(&["--model", q4k.to_str().unwrap(), "--no-cache"]);
    let (_, answer) = server.ask("What is the capital of France? Answer in one word.", 16);
    assert!(answer.contains("Paris"), "{answer}");
    server.stop();
}

#[test]
fn table_says_bytes_fallbacks_and_compounding() {
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("q5k.gguf");
    let out = quantize(&[
        model().to_str().unwrap(),
        out_path.to_str().unwrap(),
        "--type",
        "q5_k",
        "--keep-output",
        "q8_0",
    ]);
    assert!(out.status.success(), "{}", said(&out));
    let text = String::from_utf8_lossy(&out.stdout);
    for needle in [
        "(q5_k, token_embd.weight q8_0)",
        "180 tensors fell back to a type that holds their rows, as llama.cpp does:",
        "  q5_k -> q5_1, rows of 576 not whole blocks of 256: blk.*.ffn_gate.weight (x30), ",
        "blk.*.attn_q.weight (x30)",
        "note: the source was already quantized (210 q4_1)",
    ] {
        assert!(text.contains(needle), "{needle:?} not in:\n{text}");
    }
    // Piped, the table is plain columns: a row is its cells apart by spaces.
    for row in ["q5_k 30", "q5_1 180", "q8_0 1", "f32 61", "file 272"] {
        let found = text.lines().any(|l| {
            let cells: Vec<&str> = l.split_whitespace().collect();
            cells.join(" ").starts_with(&format!("{row} "))
        });
        assert!(found, "{row:?} not a row of:\n{text}");
    }
}

#[test]
fn help() {
    let out = quantize(&["--help"]);
    assert!(out.status.success(), "{}", said(&out));
    insta::assert_snapshot!("quantize_help", String::from_utf8_lossy(&out.stdout));
}

#[test]
fn bad_inputs_are_clear_errors_and_leave_no_output() {
    let dir = tempfile::tempdir().unwrap();
    let out_path = dir.path().join("out.gguf");
    let out_arg = out_path.to_str().unwrap();

    let garbage = dir.path().join("garbage.gguf");
    std::fs::write(&garbage, "this is not a model\n").unwrap();
    let out = quantize(&[garbage.to_str().unwrap(), out_arg, "--type", "q8_0"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a GGUF file"), "{err}");
    assert!(err.contains("garbage.gguf"), "{err}");

    let truncated = dir.path().join("truncated.gguf");
    let bytes = std::fs::read(model()).unwrap();
    std::fs::write(&truncated, &bytes[..bytes.len() - 1000]).unwrap();
    let out = quantize(&[truncated.to_str().unwrap(), out_arg, "--type", "q8_0"]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("truncated.gguf"), "{err}");
    assert!(
        err.contains("out of bounds") || err.contains("truncated"),
        "{err}"
    );

    let out = quantize(&[
        truncated.to_str().unwrap(),
        truncated.to_str().unwrap(),
        "--type",
        "q8_0",
    ]);
    assert_eq!(out.status.code(), Some(1), "{}", said(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("the output is the input file"), "{err}");
    assert_eq!(
        std::fs::metadata(&truncated).unwrap().len() as usize,
        bytes.len() - 1000
    );

    let out = quantize(&[model().to_str().unwrap(), out_arg, "--type", "q3_k"]);
    assert_eq!(out.status.code(), Some(2), "{}", said(&out));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("unknown type \"q3_k\": expected one of q8_0, q6_k, q5_k, q4_k, q5_1, q5_0, q4_1, q4_0, f16"),
        "{err}"
    );

    assert!(!out_path.exists());
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(left.len(), 2, "{left:?}");
}
