//! Errors as one line for the log and the state file: the HTTP fetches of [`crate::watch`]
//! and [`crate::prom_api`] say why a request failed, not only that it did.

/// An error and its causes, as one line: reqwest's own message ("error sending request")
/// says nothing of why (refused, timed out, reset).
pub fn with_causes(e: &dyn std::error::Error) -> String {
    std::iter::successors(Some(e), |e| e.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}
