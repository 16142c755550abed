//! Errors as one line, for logs, state files and answers: what failed and why, every cause
//! on the line ("error sending request" alone says nothing of refused, timed out or reset).

/// An error and its causes, as one line joined by ": ".
pub fn with_causes(e: &dyn std::error::Error) -> String {
    std::iter::successors(Some(e), |e| e.source())
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join(": ")
}
