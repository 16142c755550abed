//! A lever of the report, whichever table found it.

use std::borrow::Cow;

use serde::Serialize;

use crate::money::Money;

/// A lever worth pulling, with the dollars it puts at stake over the report's window.
#[derive(Debug, Clone, Serialize)]
pub struct Lever {
    pub lever: &'static str,
    pub dollars: Money,
    /// How the dollars were worked out, and what they assume.
    pub basis: String,
    /// What to do, with the `frugal` command that works it out where there is one.
    pub action: Cow<'static, str>,
}
