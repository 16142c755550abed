//! A parser for the Prometheus text exposition format, version 0.0.4.
//!
//! Small and ours on purpose: no maintained parser is among the workspace's dependencies,
//! the format is a page of grammar (comments, `# HELP`/`# TYPE`, one sample a line), and
//! what `frugal watch` needs from it is strictness the lenient parsers lack: a body that is
//! an HTML error page or was cut off mid-line must fail, never bill a partial scrape.

use std::collections::BTreeMap;

/// Why a body is not a scrape.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ParseError {
    #[error("the body is HTML, not Prometheus metrics (a login page or a proxy's error?)")]
    Html,
    #[error("the body is truncated: line {line} has no newline{}", reason.as_ref().map(|r| format!(" ({r})")).unwrap_or_default())]
    Truncated { line: usize, reason: Option<String> },
    #[error("line {line}: {reason}")]
    Line { line: usize, reason: String },
}

/// A metric family's declared type (`# TYPE`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MetricType {
    Counter,
    Gauge,
    Histogram,
    Summary,
    Untyped,
}

/// One sample line: `name{labels} value [timestamp]`.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    /// The series name as written, suffix included (`x_bucket`, `x_sum`, `x_count`).
    pub name: String,
    pub labels: Vec<(String, String)>,
    pub value: f64,
    /// Milliseconds since the Unix epoch, where the exporter wrote one.
    pub timestamp_ms: Option<i64>,
}

impl Sample {
    pub fn label(&self, name: &str) -> Option<&str> {
        self.labels
            .iter()
            .find(|(k, _)| k == name)
            .map(|(_, v)| v.as_str())
    }
}

/// A parsed body: its samples in order, and the types and help its families declared.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scrape {
    pub samples: Vec<Sample>,
    pub types: BTreeMap<String, MetricType>,
    pub help: BTreeMap<String, String>,
}

impl Scrape {
    /// The samples of one series name (all label sets).
    pub fn series<'a>(&'a self, name: &'a str) -> impl Iterator<Item = &'a Sample> + 'a {
        self.samples.iter().filter(move |s| s.name == name)
    }

    /// The sum of a series over its label sets; `None` when the body has no such series.
    pub fn sum(&self, name: &str) -> Option<f64> {
        self.sum_where(name, |_| true)
    }

    /// The sum over the label sets `keep` accepts; `None` when none is there.
    pub fn sum_where(&self, name: &str, keep: impl Fn(&Sample) -> bool) -> Option<f64> {
        self.series(name)
            .filter(|s| keep(s))
            .map(|s| s.value)
            .reduce(|a, b| a + b)
    }

    /// The declared type of the family a series belongs to (`x_sum` is part of `x`).
    pub fn type_of(&self, series: &str) -> Option<MetricType> {
        if let Some(t) = self.types.get(series) {
            return Some(*t);
        }
        ["_bucket", "_sum", "_count"].iter().find_map(|suffix| {
            let base = series.strip_suffix(suffix)?;
            self.types
                .get(base)
                .copied()
                .filter(|t| matches!(t, MetricType::Histogram | MetricType::Summary))
        })
    }

    /// Every metric name the body mentions, declared or sampled.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.types
            .keys()
            .map(String::as_str)
            .chain(self.samples.iter().map(|s| s.name.as_str()))
    }
}

/// Parses a whole `/metrics` body.
pub fn parse(body: &str) -> Result<Scrape, ParseError> {
    if body.trim_start().starts_with('<') {
        return Err(ParseError::Html);
    }
    let mut scrape = Scrape::default();
    // The format ends every line with a newline: without it the last line may be cut
    // mid-number (`x 12` of `x 1234`) and still parse, so the body is refused whole.
    let complete = body.is_empty() || body.ends_with('\n');
    let lines: Vec<&str> = body.lines().collect();
    for (i, raw) in lines.iter().enumerate() {
        if !complete && i + 1 == lines.len() {
            let reason = parse_line(raw, &mut Scrape::default()).err();
            return Err(ParseError::Truncated {
                line: i + 1,
                reason,
            });
        }
        parse_line(raw, &mut scrape).map_err(|reason| ParseError::Line {
            line: i + 1,
            reason,
        })?;
    }
    Ok(scrape)
}

fn parse_line(raw: &str, scrape: &mut Scrape) -> Result<(), String> {
    let text = raw.trim();
    if text.is_empty() {
        return Ok(());
    }
    if let Some(comment) = text.strip_prefix('#') {
        return parse_comment(comment.trim_start(), scrape);
    }
    let sample = parse_sample(text)?;
    scrape.samples.push(sample);
    Ok(())
}

fn parse_comment(comment: &str, scrape: &mut Scrape) -> Result<(), String> {
    let mut words = comment.splitn(3, [' ', '\t']);
    let keyword = words.next().unwrap_or_default();
    if keyword != "HELP" && keyword != "TYPE" {
        return Ok(()); // Any other comment is free text.
    }
    let name = words.next().unwrap_or_default();
    if !is_metric_name(name) {
        return Err(format!("`# {keyword}` needs a metric name, found `{name}`"));
    }
    let rest = words.next().unwrap_or_default().trim();
    if keyword == "HELP" {
        scrape.help.insert(name.to_owned(), unescape_help(rest));
        return Ok(());
    }
    let kind = match rest {
        "counter" => MetricType::Counter,
        "gauge" => MetricType::Gauge,
        "histogram" => MetricType::Histogram,
        "summary" => MetricType::Summary,
        "untyped" => MetricType::Untyped,
        other => return Err(format!("unknown metric type `{other}` for `{name}`")),
    };
    if scrape.types.insert(name.to_owned(), kind).is_some() {
        return Err(format!("a second `# TYPE` line for `{name}`"));
    }
    Ok(())
}

fn parse_sample(text: &str) -> Result<Sample, String> {
    let name_end = text
        .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_' || c == ':'))
        .unwrap_or(text.len());
    let name = &text[..name_end];
    if !is_metric_name(name) {
        return Err(format!(
            "expected a metric name, found `{}`",
            first_word(text)
        ));
    }
    let mut rest = text[name_end..].trim_start();
    let mut labels = Vec::new();
    if let Some(inner) = rest.strip_prefix('{') {
        rest = parse_labels(inner, &mut labels)
            .map_err(|e| format!("in the labels of `{name}`: {e}"))?
            .trim_start();
    }
    let mut fields = rest.split_ascii_whitespace();
    let value = match fields.next() {
        Some(v) => parse_value(v).ok_or_else(|| format!("`{v}` is not a value (`{name}`)"))?,
        None => return Err(format!("`{name}` has no value")),
    };
    let timestamp_ms = match fields.next() {
        Some(t) => Some(
            t.parse::<i64>()
                .map_err(|_| format!("`{t}` is not a timestamp in milliseconds (`{name}`)"))?,
        ),
        None => None,
    };
    if let Some(extra) = fields.next() {
        return Err(format!("unexpected `{extra}` after the sample of `{name}`"));
    }
    Ok(Sample {
        name: name.to_owned(),
        labels,
        value,
        timestamp_ms,
    })
}

/// Reads `name="value",...}` and returns what follows the closing brace.
fn parse_labels<'a>(mut s: &'a str, out: &mut Vec<(String, String)>) -> Result<&'a str, String> {
    loop {
        s = s.trim_start();
        if let Some(after) = s.strip_prefix('}') {
            return Ok(after);
        }
        let end = s
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(s.len());
        let key = &s[..end];
        if key.is_empty() || key.starts_with(|c: char| c.is_ascii_digit()) {
            return Err(format!("expected a label name, found `{}`", first_word(s)));
        }
        s = s[end..].trim_start();
        s = s
            .strip_prefix('=')
            .ok_or_else(|| format!("expected `=` after label `{key}`"))?
            .trim_start();
        s = s
            .strip_prefix('"')
            .ok_or_else(|| format!("the value of label `{key}` must be quoted"))?;
        let (value, after) = read_quoted(s).ok_or_else(|| format!("label `{key}`'s value"))?;
        if out.iter().any(|(k, _)| k == key) {
            return Err(format!("label `{key}` appears twice"));
        }
        out.push((key.to_owned(), value));
        s = after.trim_start();
        if let Some(after) = s.strip_prefix(',') {
            s = after;
        } else if !s.starts_with('}') {
            return Err(format!("expected `,` or `}}` after label `{key}`"));
        }
    }
}

/// Reads a label value after its opening quote, undoing `\\`, `\"` and `\n`; returns the
/// value and what follows the closing quote, or `None` when the quote never closes or an
/// escape is unknown.
fn read_quoted(s: &str) -> Option<(String, &str)> {
    let mut value = String::new();
    let mut chars = s.char_indices();
    while let Some((i, c)) = chars.next() {
        match c {
            '"' => return Some((value, &s[i + 1..])),
            '\\' => match chars.next()?.1 {
                '\\' => value.push('\\'),
                '"' => value.push('"'),
                'n' => value.push('\n'),
                _ => return None,
            },
            c => value.push(c),
        }
    }
    None
}

/// HELP text escapes only `\\` and `\n`; anything else is kept as written. One pass, left to
/// right: replacing `\n` first would read the escaped backslash of `\\n` (a backslash, then
/// `n`) as the start of a newline.
fn unescape_help(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars();
    while let Some(c) = chars.next() {
        if c != '\\' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('n') => out.push('\n'),
            Some('\\') => out.push('\\'),
            Some(other) => {
                out.push('\\');
                out.push(other);
            }
            None => out.push('\\'),
        }
    }
    out
}

/// Go's `ParseFloat`, as the format specifies: decimals, exponents, `+Inf`, `-Inf`, `NaN`.
fn parse_value(v: &str) -> Option<f64> {
    match v {
        "+Inf" | "Inf" => Some(f64::INFINITY),
        "-Inf" => Some(f64::NEG_INFINITY),
        "NaN" => Some(f64::NAN),
        // Rust also reads `inf` and `infinity` in any case: the format does not write them.
        _ if v
            .chars()
            .any(|c| c.is_ascii_alphabetic() && !matches!(c, 'e' | 'E')) =>
        {
            None
        }
        _ => v.parse().ok(),
    }
}

fn is_metric_name(s: &str) -> bool {
    let mut chars = s.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
}

fn first_word(s: &str) -> &str {
    s.split_ascii_whitespace().next().unwrap_or(s)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn samples_with_labels_escapes_and_timestamps() {
        let body = concat!(
            "# HELP http_requests_total The total number of HTTP requests.\n",
            "# TYPE http_requests_total counter\n",
            "http_requests_total{method=\"post\",code=\"200\"} 1027 1395066363000\n",
            "http_requests_total{method=\"post\",code=\"400\"}    3 1395066363000\n",
            "\n",
            "# A free comment, ignored.\n",
            "msdos_file_access_time_seconds{path=\"C:\\\\DIR\\\\FILE.TXT\",error=\"Cannot find file:\\n\\\"FILE.TXT\\\"\"} 1.458255915e9\n",
            "metric_without_timestamp_and_labels 12.47\n",
            "something_weird{problem=\"division by zero\"} +Inf -3982045\n",
            "spaced{ a = \"1\" , b=\"2\", } -Inf\n",
            "not_a_number NaN\n",
        );
        let s = parse(body).unwrap();
        assert_eq!(s.samples.len(), 7);
        assert_eq!(s.types["http_requests_total"], MetricType::Counter);
        assert_eq!(
            s.help["http_requests_total"],
            "The total number of HTTP requests."
        );
        assert_eq!(s.sum("http_requests_total"), Some(1030.0));
        assert_eq!(s.samples[0].timestamp_ms, Some(1_395_066_363_000));
        assert_eq!(s.samples[0].label("code"), Some("200"));
        let path = &s.samples[2];
        assert_eq!(path.label("path"), Some("C:\\DIR\\FILE.TXT"));
        assert_eq!(path.label("error"), Some("Cannot find file:\n\"FILE.TXT\""));
        assert_eq!(path.value, 1.458255915e9);
        assert_eq!(s.samples[3].labels, vec![]);
        assert_eq!(s.samples[4].value, f64::INFINITY);
        assert_eq!(s.samples[4].timestamp_ms, Some(-3_982_045));
        assert_eq!(s.samples[5].value, f64::NEG_INFINITY);
        assert_eq!(s.samples[5].label("b"), Some("2"));
        assert!(s.samples[6].value.is_nan());
        assert_eq!(s.sum("absent"), None);
    }

    #[test]
    fn histogram_and_summary_series_belong_to_their_family() {
        let body = concat!(
            "# TYPE rpc_duration_seconds histogram\n",
            "rpc_duration_seconds_bucket{le=\"0.05\"} 24054\n",
            "rpc_duration_seconds_bucket{le=\"+Inf\"} 144320\n",
            "rpc_duration_seconds_sum 53423\n",
            "rpc_duration_seconds_count 144320\n",
            "# TYPE rpc_quantiles summary\n",
            "rpc_quantiles{quantile=\"0.5\"} 4773\n",
            "rpc_quantiles_sum 1.7560473e+07\n",
            "rpc_quantiles_count 2693\n",
        );
        let s = parse(body).unwrap();
        assert_eq!(s.sum("rpc_duration_seconds_sum"), Some(53423.0));
        assert_eq!(s.sum("rpc_quantiles_sum"), Some(1.7560473e7));
        assert_eq!(
            s.type_of("rpc_duration_seconds_bucket"),
            Some(MetricType::Histogram)
        );
        assert_eq!(s.type_of("rpc_quantiles_count"), Some(MetricType::Summary));
        assert_eq!(s.type_of("rpc_quantiles"), Some(MetricType::Summary));
        assert_eq!(s.type_of("nothing_sum"), None);
        assert_eq!(s.series("rpc_duration_seconds_bucket").count(), 2);
    }

    #[test]
    fn html_is_refused() {
        assert_eq!(
            parse("<!DOCTYPE html>\n<html><body>502 Bad Gateway</body></html>\n"),
            Err(ParseError::Html)
        );
        assert_eq!(parse("\n  <html>"), Err(ParseError::Html));
    }

    #[test]
    fn a_cut_off_last_line_is_truncation_not_a_partial_scrape() {
        let err = parse("a_total 1\nb_total{x=\"unfini").unwrap_err();
        assert!(
            matches!(err, ParseError::Truncated { line: 2, .. }),
            "{err}"
        );
        assert!(err.to_string().starts_with("the body is truncated: line 2"));
        // A last line without its newline may be cut mid-number: refused even if it parses.
        assert_eq!(
            parse("a_total 1\nb_total 12"),
            Err(ParseError::Truncated {
                line: 2,
                reason: None
            })
        );
        // The same bad line with its newline is malformed, not truncated.
        let err = parse("a_total 1\nb_total{x=\"unfini\n").unwrap_err();
        assert!(matches!(err, ParseError::Line { line: 2, .. }), "{err}");
    }

    #[test]
    fn malformed_lines_name_their_line() {
        let cases = [
            ("ok 1\n1bad 2\n", 2, "expected a metric name, found `1bad`"),
            ("ok 1\n\nnovalue\n", 3, "`novalue` has no value"),
            ("x one\n", 1, "`one` is not a value (`x`)"),
            ("x 1 2 3\n", 1, "unexpected `3` after the sample of `x`"),
            (
                "x 1 1.5\n",
                1,
                "`1.5` is not a timestamp in milliseconds (`x`)",
            ),
            (
                "x{a=1} 1\n",
                1,
                "in the labels of `x`: the value of label `a` must be quoted",
            ),
            (
                "x{a=\"1\" b=\"2\"} 1\n",
                1,
                "in the labels of `x`: expected `,` or `}` after label `a`",
            ),
            (
                "x{a=\"\\t\"} 1\n",
                1,
                "in the labels of `x`: label `a`'s value",
            ),
            (
                "x{a=\"1\",a=\"2\"} 1\n",
                1,
                "in the labels of `x`: label `a` appears twice",
            ),
            (
                "# TYPE x countr\n",
                1,
                "unknown metric type `countr` for `x`",
            ),
            (
                "# TYPE x gauge\n# TYPE x gauge\n",
                2,
                "a second `# TYPE` line for `x`",
            ),
            ("# HELP\n", 1, "`# HELP` needs a metric name, found ``"),
            ("x infinity\n", 1, "`infinity` is not a value (`x`)"),
        ];
        for (body, line, reason) in cases {
            assert_eq!(
                parse(body),
                Err(ParseError::Line {
                    line,
                    reason: reason.to_owned()
                }),
                "{body:?}"
            );
        }
        assert_eq!(
            ParseError::Line {
                line: 4,
                reason: "r".into()
            }
            .to_string(),
            "line 4: r"
        );
    }

    /// Found by `fuzz_expo_round_trip`: an escaped backslash before `n` is a backslash and
    /// an `n`, not a backslash and a newline.
    #[test]
    fn help_escapes_read_left_to_right() {
        let help = |body: &str| parse(body).unwrap().help["x"].clone();
        assert_eq!(help("# HELP x a\\\\nb\n"), "a\\nb");
        assert_eq!(help("# HELP x a\\nb\\\\\n"), "a\nb\\");
        assert_eq!(help("# HELP x C:\\dir \\\n"), "C:\\dir \\");
    }

    #[test]
    fn empty_bodies_and_crlf_parse() {
        assert_eq!(parse("").unwrap().samples, vec![]);
        let s = parse("# TYPE x gauge\r\nx 3\r\n").unwrap();
        assert_eq!(s.sum("x"), Some(3.0));
        assert_eq!(parse("x 1e3\n").unwrap().sum("x"), Some(1000.0));
    }
}

#[cfg(test)]
mod fuzz;
