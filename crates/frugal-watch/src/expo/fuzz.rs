//! Fuzz targets of the exposition parser: real `/metrics` bodies mutated, any text, and
//! generated scrapes written out and read back.

use proptest::collection::vec;
use proptest::prelude::*;

use super::*;
use frugal_testkit::fuzz::{Mutation, cases, mutate};

/// Real bodies of the engines `frugal watch` reads (data/watch, see its PROVENANCE.md).
fn seeds() -> Vec<Vec<u8>> {
    let dir = frugal_testkit::repo("data/watch");
    let mut seeds: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|e| e == "prom"))
        .map(|p| std::fs::read(p).unwrap())
        .collect();
    seeds.sort();
    assert!(seeds.len() >= 5, "the bodies in {}", dir.display());
    seeds
}

const DICT: &[&[u8]] = &[
    b"\n",
    b"\r\n",
    b"{",
    b"}",
    b"\"",
    b"\\",
    b"\\n",
    b"=",
    b",",
    b" ",
    b"\t",
    b"# TYPE ",
    b"# HELP ",
    b"counter",
    b"histogram",
    b"+Inf",
    b"-Inf",
    b"NaN",
    b"1e308",
    b"<html>",
    b"\xff",
    b"\xc3",
    b"\xe2\x82",
];

fn mutations() -> impl Strategy<Value = Vec<Mutation>> {
    vec(any::<Mutation>(), 0..8)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases("fuzz_expo_mutated_bodies", 200)))]

    /// Any mutation of a real body parses or fails with a line number within the body.
    #[test]
    fn fuzz_expo_mutated_bodies(seed in 0usize..64, m in mutations()) {
        let seeds = seeds();
        let bytes = mutate(&seeds[seed % seeds.len()], &m, DICT);
        let body = String::from_utf8_lossy(&bytes);
        match parse(&body) {
            Ok(_) | Err(ParseError::Html) => {}
            Err(ParseError::Truncated { line, .. } | ParseError::Line { line, .. }) => {
                prop_assert!(line >= 1 && line <= body.lines().count(), "line {line}");
            }
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases("fuzz_expo_cut_bodies", 200)))]

    /// A real body cut anywhere but after a newline is refused, never a partial scrape.
    #[test]
    fn fuzz_expo_cut_bodies(seed in 0usize..64, at in any::<prop::sample::Index>()) {
        let seeds = seeds();
        let body = String::from_utf8(seeds[seed % seeds.len()].clone()).unwrap();
        prop_assert!(parse(&body).is_ok());
        let cut = at.index(body.len());
        prop_assume!(body.is_char_boundary(cut));
        let short = &body[..cut];
        let parsed = parse(short);
        if short.is_empty() || short.ends_with('\n') {
            prop_assert!(parsed.is_ok(), "{parsed:?}");
        } else {
            prop_assert!(
                matches!(parsed, Err(ParseError::Truncated { .. })),
                "cut at {cut}: {parsed:?}"
            );
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases("fuzz_expo_any_text", 500)))]

    /// Text of any characters, weighted to the format's own, never panics.
    #[test]
    fn fuzz_expo_any_text(text in "([a-z_:{}=,\"\\\\# \t\r\n0-9.eE+-]|HELP|TYPE|Inf|NaN|\\PC){0,80}") {
        let _ = parse(&text);
    }
}

/// A scrape as an exporter would have it: families with help, a type and samples.
#[derive(Debug, Clone)]
struct Family {
    name: String,
    help: Option<String>,
    kind: Option<MetricType>,
    samples: Vec<Line>,
}

/// One sample line of a family: labels, value, timestamp.
type Line = (Vec<(String, String)>, f64, Option<i64>);

fn value() -> impl Strategy<Value = f64> {
    prop_oneof![
        any::<f64>().prop_filter("one NaN", |v| !v.is_nan()),
        Just(f64::NAN),
        Just(f64::INFINITY),
        Just(f64::NEG_INFINITY),
        (0u32..1_000_000).prop_map(f64::from),
    ]
}

fn text(max: usize) -> impl Strategy<Value = String> {
    vec(
        prop_oneof![Just('\\'), Just('"'), Just('\n'), Just('n'), any::<char>()],
        0..max,
    )
    .prop_map(String::from_iter)
}

fn family() -> impl Strategy<Value = Family> {
    let kind = prop_oneof![
        Just(MetricType::Counter),
        Just(MetricType::Gauge),
        Just(MetricType::Histogram),
        Just(MetricType::Summary),
        Just(MetricType::Untyped),
    ];
    let labels = proptest::collection::btree_map("[a-zA-Z_][a-zA-Z0-9_]{0,8}", text(12), 0..4)
        .prop_map(|m| m.into_iter().collect::<Vec<_>>());
    (
        "[a-zA-Z_:][a-zA-Z0-9_:]{0,16}",
        proptest::option::of(
            text(40).prop_filter("help is trimmed", |h| h.trim() == h && !h.contains('\r')),
        ),
        proptest::option::of(kind),
        vec((labels, value(), proptest::option::of(any::<i64>())), 0..4),
    )
        .prop_map(|(name, help, kind, samples)| Family {
            name,
            help,
            kind,
            samples,
        })
}

/// Writes families as the format says: help escapes `\` and newline, label values also `"`.
fn render(families: &[Family]) -> String {
    let help_escape = |s: &str| s.replace('\\', "\\\\").replace('\n', "\\n");
    let label_escape = |s: &str| help_escape(s).replace('"', "\\\"");
    let mut out = String::new();
    for f in families {
        if let Some(help) = &f.help {
            out += &format!("# HELP {} {}\n", f.name, help_escape(help));
        }
        if let Some(kind) = f.kind {
            let kind = format!("{kind:?}").to_ascii_lowercase();
            out += &format!("# TYPE {} {kind}\n", f.name);
        }
        for (labels, value, ts) in &f.samples {
            out += &f.name;
            if !labels.is_empty() {
                let inner: Vec<String> = labels
                    .iter()
                    .map(|(k, v)| format!("{k}=\"{}\"", label_escape(v)))
                    .collect();
                out += &format!("{{{}}}", inner.join(","));
            }
            out += &match *value {
                v if v.is_nan() => " NaN".to_owned(),
                v if v == f64::INFINITY => " +Inf".to_owned(),
                v if v == f64::NEG_INFINITY => " -Inf".to_owned(),
                v => format!(" {v:?}"),
            };
            if let Some(ts) = ts {
                out += &format!(" {ts}");
            }
            out += "\n";
        }
    }
    out
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(cases("fuzz_expo_round_trip", 300)))]

    /// A generated scrape written out reads back as it was: every sample, label value
    /// (escapes included), type and help text.
    #[test]
    fn fuzz_expo_round_trip(
        families in vec(family(), 0..5)
            .prop_filter("one family per name", |fs| {
                let names: std::collections::BTreeSet<_> = fs.iter().map(|f| &f.name).collect();
                names.len() == fs.len()
            })
    ) {
        let body = render(&families);
        let parsed = parse(&body).map_err(|e| TestCaseError::fail(format!("{e}\n{body}")))?;
        let mut want = Scrape::default();
        for f in &families {
            if let Some(help) = &f.help {
                want.help.insert(f.name.clone(), help.clone());
            }
            if let Some(kind) = f.kind {
                want.types.insert(f.name.clone(), kind);
            }
            for (labels, value, ts) in &f.samples {
                want.samples.push(Sample {
                    name: f.name.clone(),
                    labels: labels.clone(),
                    value: *value,
                    timestamp_ms: *ts,
                });
            }
        }
        // Debug prints NaN as NaN, so equal scrapes print alike.
        prop_assert_eq!(format!("{parsed:?}"), format!("{want:?}"), "{}", body);
    }
}
