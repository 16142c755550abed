//! Why a price file or a lookup in the catalog failed.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum CatalogError {
    #[error("built-in price data {file} row {row}: {message}")]
    Builtin {
        file: &'static str,
        row: usize,
        message: String,
    },
    #[error("cannot read price file {path}")]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("price file {path}: {message}")]
    Invalid { path: PathBuf, message: String },
    #[error("model price table {path}: {message}")]
    ModelTable { path: PathBuf, message: String },
    #[error("unknown instance type `{name}`{}", suggest(.suggestions))]
    UnknownInstance {
        name: String,
        suggestions: Vec<String>,
    },
    #[error("instance type `{name}` is not priced in region `{region}` (priced in: {})", .known.join(", "))]
    UnknownRegion {
        name: String,
        region: String,
        known: Vec<String>,
    },
    #[error("instance type `{name}` is priced in several regions ({}); name one", .known.join(", "))]
    AmbiguousRegion { name: String, known: Vec<String> },
    #[error("model `{name}` has no per-token price in the catalog{}", suggest(.suggestions))]
    UnknownModel {
        name: String,
        suggestions: Vec<String>,
    },
}

fn suggest(names: &[String]) -> String {
    if names.is_empty() {
        String::new()
    } else {
        format!("; did you mean {}?", names.join(", "))
    }
}
