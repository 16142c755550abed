//! The path of one request once admitted: the gateway's state, which names its backend
//! ([`state`]), the pipeline *consult the caches -> produce -> settle* ([`pipeline`]), and
//! the bill that settles on every exit ([`settle`]); an embeddings request takes the same
//! bill and caches on a path of its own ([`embed`]); a sampled share of cheap answers is
//! checked on the reference path in the background ([`shadow`]).

pub mod embed;
pub mod pipeline;
pub mod settle;
pub mod shadow;
pub(crate) mod state;
