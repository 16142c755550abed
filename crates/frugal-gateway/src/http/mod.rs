//! OpenAI's HTTP API as frugal serves it: the wire shapes ([`api`]), the one error type
//! ([`error`]), validation into a [`validate::Job`] (an [`embeddings::EmbeddingJob`] for
//! `/v1/embeddings`), the router and its handlers ([`router`]), and the rendering of answers
//! with what they cost ([`render`]).

pub mod api;
pub mod embeddings;
pub mod error;
pub(crate) mod render;
pub mod router;
pub mod validate;
