//! The path of one request once admitted: the gateway's state, which names its backend
//! ([`state`]), the pipeline *consult the caches -> produce -> settle* ([`pipeline`]), and
//! the bill that settles on every exit ([`settle`]).

pub mod pipeline;
pub mod settle;
pub(crate) mod state;
