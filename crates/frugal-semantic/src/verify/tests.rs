#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::sync::OnceLock;

use safetensors::tensor::TensorView;

use super::*;

fn base() -> std::path::PathBuf {
    frugal_testkit::repo(crate::DEFAULT_EMBEDDER)
}

/// The shipped verifier, loaded once for all tests.
pub(crate) fn verifier() -> &'static Verifier {
    static V: OnceLock<Verifier> = OnceLock::new();
    V.get_or_init(|| {
        Verifier::load(&base(), &frugal_testkit::repo(DEFAULT_VERIFIER))
            .expect("run scripts/fetch-models.sh minilm")
    })
}

#[test]
fn matches_the_trained_model_on_its_reference_pairs() {
    // Logits torch computed in f32 when the verifier was trained; ours run on Q8_0 weights.
    let text = std::fs::read_to_string(frugal_testkit::repo(
        "data/semantic-cache/verifier-reference.json",
    ))
    .unwrap();
    let pairs: Vec<serde_json::Value> = serde_json::from_str(&text).unwrap();
    assert!(pairs.len() >= 20);
    for p in pairs {
        let (cached, asked) = (p["cached"].as_str().unwrap(), p["asked"].as_str().unwrap());
        let want = p["logit"].as_f64().unwrap() as f32;
        let got = verifier().logit(cached, asked).unwrap();
        assert!(
            (got - want).abs() < 0.1 + 0.03 * want.abs(),
            "{cached:?} / {asked:?}: {got} against torch's {want}"
        );
    }
}

#[test]
fn a_reworded_question_is_likelier_the_same_than_one_word_changed() {
    let v = verifier();
    for (cached, same, other) in [
        (
            "Who wrote Pride and Prejudice?",
            "Who is the author of Pride and Prejudice?",
            "Who published Pride and Prejudice?",
        ),
        (
            "What is the capital of Australia?",
            "What's Australia's capital city?",
            "What is the largest city of Australia?",
        ),
    ] {
        let (l_same, l_other) = (
            v.logit(cached, same).unwrap(),
            v.logit(cached, other).unwrap(),
        );
        assert!(l_same > l_other, "{cached:?}: {l_same} <= {l_other}");
        let r = Reading {
            cosine: 0.9,
            aligned: false,
            soft_veto: false,
        };
        let p = v.probability(cached, same, &r).unwrap();
        assert!((0.0..=1.0).contains(&p));
    }
}

fn write(path: &std::path::Path, tensors: &[(&str, Vec<usize>, Vec<f32>)], meta: &[(&str, &str)]) {
    let bytes: Vec<(String, Vec<u8>, Vec<usize>)> = tensors
        .iter()
        .map(|(n, shape, data)| {
            let b = data.iter().flat_map(|x| x.to_le_bytes()).collect();
            (n.to_string(), b, shape.clone())
        })
        .collect();
    let views: Vec<(String, TensorView)> = bytes
        .iter()
        .map(|(n, b, s)| {
            (
                n.clone(),
                TensorView::new(safetensors::Dtype::F32, s.clone(), b).unwrap(),
            )
        })
        .collect();
    let meta: HashMap<String, String> = meta
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    safetensors::serialize_to_file(views, Some(meta), path).unwrap();
}

#[test]
fn broken_verifier_files_are_clear_errors() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("v.safetensors");
    let err = |f: &std::path::Path| Verifier::load(&base(), f).unwrap_err().to_string();
    assert!(err(&f).contains("cannot read"), "{}", err(&f));
    std::fs::write(&f, b"garbage").unwrap();
    assert!(err(&f).contains("not a safetensors file"), "{}", err(&f));
    let head = ("head.weight", vec![HIDDEN], vec![0.0; HIDDEN]);
    let bias = ("head.bias", vec![1], vec![0.5]);
    write(&f, std::slice::from_ref(&head), &[]);
    assert!(err(&f).contains("head.bias"), "{}", err(&f));
    write(&f, &[head.clone(), bias.clone()], &[("layers", "9")]);
    assert!(err(&f).contains("9 layers"), "{}", err(&f));
    write(
        &f,
        &[head.clone(), bias.clone()],
        &[("calibration", "1 2 x")],
    );
    assert!(err(&f).contains("is not 5 numbers"), "{}", err(&f));
    // An adapter whose input width is not the layer's.
    let a = (
        "encoder.layer.0.attention.self.query.lora_a",
        vec![2, 7],
        vec![0.0; 14],
    );
    let b = (
        "encoder.layer.0.attention.self.query.lora_b",
        vec![HIDDEN, 2],
        vec![0.0; 2 * HIDDEN],
    );
    write(&f, &[head.clone(), bias.clone(), a, b], &[("layers", "1")]);
    assert!(err(&f).contains("adapter"), "{}", err(&f));
    // A head alone on one layer loads, and scores its bias for any pair; a calibration
    // written into the file is read back.
    write(&f, &[head, bias], &[("layers", "1")]);
    let c = Calibration {
        w: [2.0, 1.0, 0.5, -1.0],
        b: -0.5,
    };
    Verifier::write_choice(&f, &c, 0.65).unwrap();
    let v = Verifier::load(&base(), &f).unwrap();
    assert_eq!((v.calibration, v.floor), (c, 0.65));
    assert_eq!(v.logit("a", "b").unwrap(), 0.5);
    let r = Reading {
        cosine: 0.8,
        aligned: true,
        soft_veto: false,
    };
    // 2 * 0.5 + 0.8 + 0.5 - 0.5 = 1.8
    let want = 1.0 / (1.0 + (-1.8f32).exp());
    assert!((v.probability("a", "b", &r).unwrap() - want).abs() < 1e-6);
}

#[test]
fn the_calibration_fit_recovers_known_weights() {
    // Logits and cosines on a grid, labelled so that P(same | x) = sigmoid(2 logit + 3
    // cosine - 2 - soft) exactly in frequency.
    let mut samples = Vec::new();
    for i in -20..=20 {
        for (j, soft) in [(0, false), (5, false), (10, true)] {
            let (x, c) = (i as f32 / 10.0, 0.5 + j as f32 / 20.0);
            let r = Reading {
                cosine: c,
                aligned: false,
                soft_veto: soft,
            };
            let z = 2.0 * x + 3.0 * c - 2.0 - f32::from(u8::from(soft));
            let same = ((1.0 / (1.0 + (-z).exp())) * 1000.0).round() as usize;
            samples.extend(std::iter::repeat_n((x, r, true, 1.0), same));
            samples.extend(std::iter::repeat_n((x, r, false, 1.0), 1000 - same));
        }
    }
    let c = Calibration::fit(&samples);
    let close = |a: f32, b: f32| (a - b).abs() < 0.1;
    assert!(
        close(c.w[0], 2.0) && close(c.w[1], 3.0) && close(c.w[3], -1.0) && close(c.b, -2.0),
        "{c:?}"
    );
    // Weights count as repeats.
    let halved: Vec<_> = samples.iter().map(|s| (s.0, s.1, s.2, 0.5)).collect();
    let h = Calibration::fit(&halved);
    assert!(close(h.w[0], c.w[0]) && close(h.b, c.b), "{h:?}");
}
