//! What the engine's benches share (a folder, so that cargo does not take it for a bench).

use frugal_engine::model::{Chunk, KvCache, Model, ModelError};

/// `n` caches, each holding the same `len` synthetic context tokens (a spread of ids, no
/// text): where a bench decodes after a long context.
pub fn prefilled(model: &Model, n: usize, len: u32) -> Result<Vec<KvCache>, ModelError> {
    let context: Vec<u32> = (0..len).map(|i| 1000 + (i * 37) % 20000).collect();
    let mut caches: Vec<KvCache> = (0..n).map(|_| KvCache::new(&model.config)).collect();
    for c in caches.iter_mut() {
        model.forward(&mut [Chunk {
            tokens: &context,
            cache: c,
            logits: 0,
        }])?;
    }
    Ok(caches)
}
