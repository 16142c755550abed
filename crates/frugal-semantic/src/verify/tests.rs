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
        let (p_same, p_other) = (
            v.probability(cached, same).unwrap(),
            v.probability(cached, other).unwrap(),
        );
        assert!(p_same > p_other, "{cached:?}: {p_same} <= {p_other}");
        let p = v.probability(cached, same).unwrap();
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
    write(&f, &[head.clone(), bias.clone()], &[("platt_a", "x")]);
    assert!(err(&f).contains("not a number"), "{}", err(&f));
    // An adapter whose input width is not the layer's.
    let a = ("encoder.layer.0.attention.self.query.lora_a", vec![2, 7], vec![0.0; 14]);
    let b = ("encoder.layer.0.attention.self.query.lora_b", vec![HIDDEN, 2], vec![0.0; 2 * HIDDEN]);
    write(&f, &[head.clone(), bias.clone(), a, b], &[("layers", "1")]);
    assert!(err(&f).contains("adapter"), "{}", err(&f));
    // A head alone on one layer loads, and scores its bias for any pair.
    write(&f, &[head, bias], &[("layers", "1"), ("platt_a", "2"), ("platt_b", "0")]);
    let v = Verifier::load(&base(), &f).unwrap();
    assert_eq!(v.logit("a", "b").unwrap(), 0.5);
    assert!((v.probability("a", "b").unwrap() - 1.0 / (1.0 + (-1.0f32).exp())).abs() < 1e-6);
}

#[test]
fn the_platt_fit_recovers_a_known_calibration() {
    // Logits on a grid, labelled so that P(same | x) = sigmoid(2x - 1) exactly in frequency.
    let mut samples = Vec::new();
    for i in -40..=40 {
        let x = i as f32 / 10.0;
        let p = 1.0 / (1.0 + (-(2.0 * x - 1.0)).exp());
        let same = (p * 1000.0).round() as usize;
        samples.extend(std::iter::repeat_n((x, true, 1.0), same));
        samples.extend(std::iter::repeat_n((x, false, 1.0), 1000 - same));
    }
    let c = Calibration::fit(&samples);
    assert!((c.a - 2.0).abs() < 0.05 && (c.b + 1.0).abs() < 0.05, "{c:?}");
    // Weights count as repeats.
    let halved: Vec<(f32, bool, f64)> = samples.iter().map(|s| (s.0, s.1, 0.5)).collect();
    let h = Calibration::fit(&halved);
    assert!((h.a - c.a).abs() < 0.05 && (h.b - c.b).abs() < 0.05, "{h:?}");
}
