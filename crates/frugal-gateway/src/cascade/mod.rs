//! Cascades: a route's tiers from cheapest to dearest and their skip rules ([`route`]),
//! a request run through them ([`run`]), and the offline replay that chooses a route's
//! threshold ([`eval`], `frugal eval-route`), and a learned router that skips the cheap tier
//! by the question alone ([`learned`]).

pub mod eval;
pub mod learned;
pub mod route;
pub(crate) mod run;
