//! What a `--model` names, the same on every command: a GGUF file, or a served name.

use std::path::{Path, PathBuf};

/// A `--model` value: a path to an existing file, or any name ending `.gguf`, is the file
/// (to run); anything else is a served name (the local model, an upstream, a pool or a
/// route).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelRef {
    File(PathBuf),
    Served(String),
}

impl ModelRef {
    pub fn parse(s: &str) -> ModelRef {
        let path = Path::new(s);
        let gguf = path
            .extension()
            .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
        if gguf || path.is_file() {
            ModelRef::File(path.to_owned())
        } else {
            ModelRef::Served(s.to_owned())
        }
    }

    /// The name clients ask for: a file is served under its name without `.gguf`, as
    /// `frugal serve` names it.
    pub fn served_name(&self) -> String {
        match self {
            ModelRef::Served(name) => name.clone(),
            ModelRef::File(path) => file_model_name(path),
        }
    }
}

/// `frugal serve`'s default served name for a model file: its name without `.gguf`.
pub fn file_model_name(path: &Path) -> String {
    path.file_stem()
        .map_or("model".into(), |s| s.to_string_lossy().into_owned())
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used)]

    use super::*;

    #[test]
    fn a_gguf_or_an_existing_file_is_a_file_and_anything_else_a_served_name() {
        let dir = tempfile::tempdir().unwrap();
        let existing = dir.path().join("weights.bin");
        std::fs::write(&existing, b"").unwrap();
        let existing = existing.to_str().unwrap();
        assert_eq!(
            ModelRef::parse("models/missing/M.Q4_1.gguf"),
            ModelRef::File("models/missing/M.Q4_1.gguf".into())
        );
        assert_eq!(ModelRef::parse("M.GGUF"), ModelRef::File("M.GGUF".into()));
        assert_eq!(ModelRef::parse(existing), ModelRef::File(existing.into()));
        assert_eq!(
            ModelRef::parse("gpt-4o-mini"),
            ModelRef::Served("gpt-4o-mini".into())
        );
        assert_eq!(
            ModelRef::parse("models/smollm2/M.Q4_1.gguf").served_name(),
            "M.Q4_1"
        );
        assert_eq!(ModelRef::parse("chat").served_name(), "chat");
    }
}
