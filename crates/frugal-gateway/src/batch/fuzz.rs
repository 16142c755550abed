//! Fuzz targets of the batch input reader (`input::parse`): a real input mutated byte by
//! byte, and generated inputs whose faulty lines are known. Kept apart from input.rs's own
//! tests.

use proptest::collection::vec;
use proptest::prelude::*;
use serde_json::{Value, json};

use super::input::{Limits, parse};
use frugal_testkit::fuzz::{Mutation, capped, cases, mutate};

/// A batch input as `scripts/make-batch.py` and the OpenAI SDK tests write one: QQP
/// questions (data/workload), greedy chat requests, plus one completion.
fn seed() -> Vec<u8> {
    let questions = [
        "What is a new business to start with less investment?",
        "Why does Quora open each link in a new tab?",
        "What are Some of the best gadgets on 2016?",
    ];
    let mut out = String::new();
    for (i, q) in questions.iter().enumerate() {
        let line = json!({
            "custom_id": format!("req-{i}"),
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {
                "model": "SmolLM2-135M-Instruct.Q4_1",
                "messages": [{"role": "user", "content": q}],
                "max_tokens": 24,
                "temperature": 0,
            },
        });
        out += &format!("{line}\n");
    }
    out += r#"{"custom_id":"c","method":"POST","url":"/v1/completions","body":{"prompt":"Once upon","max_tokens":8}}"#;
    out += "\n\n";
    out.into_bytes()
}

const DICT: &[&[u8]] = &[
    b"\n",
    b"\r\n",
    b" ",
    b"{",
    b"}",
    b"[",
    b"]",
    b"\"",
    b":",
    b",",
    b"null",
    b"\"req-0\"",
    b"\"custom_id\":",
    b"\"method\":\"GET\",",
    b"\"url\":\"/v1/embeddings\",",
    b"\"stream\":true,",
    b"\"messages\":[],",
    b"\xff",
];

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases("fuzz_batch_mutated_input", 400)))]

    /// Any mutation of a real input is read or refused with errors that name real lines,
    /// within an allocation bounded by the input's size.
    #[test]
    fn fuzz_batch_mutated_input(m in vec(any::<Mutation>(), 0..8)) {
        let data = mutate(&seed(), &m, DICT);
        let segments = data.split(|b| *b == b'\n').count();
        let (parsed, peak) = capped(64 << 20, &data, || parse(&data, &Limits::default()));
        prop_assert!(peak <= 64 * data.len() + (1 << 20), "{peak} bytes");
        match parsed {
            Ok(input) => {
                let mut ids: Vec<&str> = input.lines.iter().map(|l| l.custom_id.as_str()).collect();
                ids.sort_unstable();
                ids.dedup();
                prop_assert_eq!(ids.len(), input.lines.len());
                prop_assert!(input.lines.iter().all(|l| l.number >= 1 && l.number <= segments));
            }
            Err(errors) => {
                prop_assert!(!errors.data.is_empty());
                for e in &errors.data {
                    prop_assert!(e.line.is_none_or(|n| n >= 1 && n <= segments), "{e:?}");
                }
            }
        }
    }
}

/// One line of a generated input and the error code it must get (`None`: a valid line).
#[derive(Debug, Clone)]
enum Fault {
    None,
    Blank,
    NotJson,
    NotObject,
    NoCustomId,
    Get,
    BadUrl,
    Stream,
    NoMessages,
    Duplicate,
}

impl Fault {
    fn code(&self) -> Option<&'static str> {
        Some(match self {
            Fault::None | Fault::Blank => return None,
            Fault::NotJson => "invalid_json_line",
            Fault::NotObject => "invalid_request",
            Fault::NoCustomId => "missing_required_parameter",
            Fault::Get => "invalid_value",
            Fault::BadUrl => "invalid_url",
            Fault::Stream => "streaming_unsupported",
            Fault::NoMessages => "invalid_request",
            Fault::Duplicate => "duplicate_custom_id",
        })
    }

    fn line(&self, i: usize, question: &str) -> String {
        let mut v = json!({
            "custom_id": format!("req-{i}"),
            "method": "POST",
            "url": "/v1/chat/completions",
            "body": {"messages": [{"role": "user", "content": question}], "max_tokens": 4},
        });
        match self {
            Fault::None | Fault::NotJson | Fault::NotObject | Fault::Blank => {}
            Fault::NoCustomId => drop(v.as_object_mut().unwrap().remove("custom_id")),
            Fault::Get => v["method"] = json!("GET"),
            Fault::BadUrl => v["url"] = json!("/v1/embeddings"),
            Fault::Stream => v["body"]["stream"] = json!(true),
            Fault::NoMessages => v["body"]["messages"] = json!([]),
            Fault::Duplicate => v["custom_id"] = json!("req-0"),
        }
        match self {
            Fault::Blank => " \t\r".to_owned(),
            Fault::NotJson => {
                let mut s = v.to_string();
                s.pop(); // The closing brace.
                s
            }
            Fault::NotObject => Value::Array(vec![v]).to_string(),
            _ => v.to_string(),
        }
    }
}

fn fault() -> impl Strategy<Value = Fault> {
    prop_oneof![
        6 => Just(Fault::None),
        1 => Just(Fault::Blank),
        1 => Just(Fault::NotJson),
        1 => Just(Fault::NotObject),
        1 => Just(Fault::NoCustomId),
        1 => Just(Fault::Get),
        1 => Just(Fault::BadUrl),
        1 => Just(Fault::Stream),
        1 => Just(Fault::NoMessages),
        1 => Just(Fault::Duplicate),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases("fuzz_batch_known_faults", 300)))]

    /// Generated inputs: valid lines are read in order with their ids; each faulty line is
    /// named with its code and its line number, and no valid line is.
    #[test]
    fn fuzz_batch_known_faults(
        lines in vec((fault(), "\\PC{0,24}"), 1..9),
        crlf in any::<bool>(),
    ) {
        // The first line is valid, so a duplicate has an id to repeat.
        let mut lines = lines;
        lines[0].0 = Fault::None;
        let text: Vec<String> = lines.iter().enumerate().map(|(i, (f, q))| f.line(i, q)).collect();
        let data = text.join(if crlf { "\r\n" } else { "\n" }).into_bytes();
        let want: Vec<(usize, &'static str)> = lines
            .iter()
            .enumerate()
            .filter_map(|(i, (f, _))| Some((i + 1, f.code()?)))
            .collect();
        match parse(&data, &Limits::default()) {
            Ok(input) => {
                prop_assert!(want.is_empty(), "accepted, but {want:?}");
                let valid: Vec<usize> = lines
                    .iter()
                    .enumerate()
                    .filter(|(_, (f, _))| matches!(f, Fault::None))
                    .map(|(i, _)| i + 1)
                    .collect();
                let read: Vec<usize> = input.lines.iter().map(|l| l.number).collect();
                prop_assert_eq!(read, valid);
                for l in &input.lines {
                    prop_assert_eq!(&l.custom_id, &format!("req-{}", l.number - 1));
                }
            }
            Err(errors) => {
                let mut got: Vec<(usize, &'static str)> = errors
                    .data
                    .iter()
                    .map(|e| (e.line.unwrap_or(0), e.code))
                    .collect();
                got.dedup();
                prop_assert_eq!(got, want);
            }
        }
    }
}
