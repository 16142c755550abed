//! JSON lines files (a route's skip examples, the cascade evaluation's questions): one
//! value per non-blank line, an error naming the file and line.

use std::path::{Path, PathBuf};

use thiserror::Error;

#[derive(Debug, Error)]
pub enum JsonLinesError {
    #[error("cannot read {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("{} line {line}: expected {expected}", path.display())]
    Parse {
        path: PathBuf,
        line: usize,
        expected: String,
        #[source]
        source: serde_json::Error,
    },
}

/// One JSON value per non-blank line of `path`; an error names the line and what was
/// `expected` there.
pub fn read<T: serde::de::DeserializeOwned>(
    path: &Path,
    expected: &str,
) -> Result<Vec<T>, JsonLinesError> {
    let text = std::fs::read_to_string(path).map_err(|source| JsonLinesError::Read {
        path: path.to_owned(),
        source,
    })?;
    parse(&text, path, expected)
}

/// [`read`] on text already read from `path`.
pub fn parse<T: serde::de::DeserializeOwned>(
    text: &str,
    path: &Path,
    expected: &str,
) -> Result<Vec<T>, JsonLinesError> {
    text.lines()
        .enumerate()
        .filter(|(_, l)| !l.trim().is_empty())
        .map(|(i, l)| {
            serde_json::from_str(l).map_err(|source| JsonLinesError::Parse {
                path: path.to_owned(),
                line: i + 1,
                expected: expected.to_owned(),
                source,
            })
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn blank_lines_are_skipped_and_a_bad_line_is_named() {
        let path = Path::new("x.jsonl");
        let v: Vec<u32> = parse("1\n\n  \n2\n", path, "N").unwrap();
        assert_eq!(v, [1, 2]);
        let err = parse::<u32>("1\n\"a\"\n", path, "a number").unwrap_err();
        assert_eq!(err.to_string(), "x.jsonl line 2: expected a number");
    }
}
