//! Tokenizer: text to token ids and back, built from the vocabulary embedded in a GGUF file.
//!
//! Only `tokenizer.ggml.model = "gpt2"` (byte-level BPE, used by SmolLM2, Llama 3, Qwen, ...)
//! is implemented; other models are a clear error. Encoding is delegated to the `tokenizers`
//! crate, configured to reproduce llama.cpp's behaviour for the file's `tokenizer.ggml.pre`
//! pre-tokenizer: same splitting regexes, control tokens recognised in the text as single
//! ids, no BOS added (callers decide via [`Tokenizer::add_bos_token`], or use
//! [`crate::prompt`], which does). [`Tokenizer::encode_ordinary`] is the same without
//! control tokens, for text a user wrote. Decoding goes through
//! a per-token byte table so that whole-sequence decoding and [`StreamDecoder`] produce
//! exactly the same text.

use std::collections::HashMap;
use std::ops::Range;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use thiserror::Error;
use tokenizers::models::bpe::{BPE, BpeTrainer, Vocab};
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::split::{Split, SplitPattern};
use tokenizers::{
    AddedToken, DecoderWrapper, Model, NormalizerWrapper, OffsetReferential, OffsetType,
    PostProcessorWrapper, SplitDelimiterBehavior, Token, TokenizerImpl,
};

use crate::gguf::{Gguf, GgufError};

/// llama.cpp's `llama_token_type` values stored in `tokenizer.ggml.token_type`.
mod token_type {
    pub const UNKNOWN: i32 = 2;
    pub const CONTROL: i32 = 3;
    pub const USER_DEFINED: i32 = 4;
}

/// Token texts that end a generation, as llama.cpp's `special_eog_ids` (llama-vocab.cpp):
/// it also treats them as control tokens whatever their stored type, so "</s>" in a Qwen
/// prompt is one token there and here.
const END_OF_GENERATION: &[&str] = &[
    "<|eot_id|>",
    "<|im_end|>",
    "<|end|>",
    "<|return|>",
    "<|call|>",
    "<|flush|>",
    "<|calls|>",
    "<end_of_turn>",
    "<|endoftext|>",
    "</s>",
    "<|eom_id|>",
    "<EOT>",
    "_<EOT>",
    "[EOT]",
    "[EOS]",
    "<|end_of_text|>",
    "<end_of_utterance>",
    "<eos>",
    "<turn|>",
    "<|tool_response>",
    "<｜end▁of▁sentence｜>",
    "[e~[",
    // Fill-in-the-middle pad, repository and file separators end it too.
    "<|fim_pad|>",
    "<fim-pad>",
    "<fim_pad>",
    "<PAD>",
    "[PAD]",
    "<|fim_repo|>",
    "<|repo_name|>",
    "<fim-repo>",
    "<REPO>",
    "<reponame>",
    "<|file_sep|>",
];

#[derive(Debug, Error)]
pub enum TokenizerError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error(
        "unsupported tokenizer model {0:?} (tokenizer.ggml.model): only \"gpt2\" (byte-level BPE) is implemented"
    )]
    UnsupportedModel(String),
    #[error(
        "unsupported pre-tokenizer {0:?} (tokenizer.ggml.pre): supported are \"gpt2\", \"smollm\", \"qwen2\" and the llama.cpp types sharing their regexes (starcoder, refact, command-r, codeshell, exaone, minerva, hunyuan, solar-open)"
    )]
    UnsupportedPreTokenizer(String),
    #[error("tokenizer.ggml.token_type has {types} entries but tokenizer.ggml.tokens has {tokens}")]
    TokenTypeCount { tokens: usize, types: usize },
    #[error("vocabulary of {0} tokens does not fit in u32 ids")]
    VocabTooLarge(usize),
    #[error(
        "tokenizer.ggml.merges entry #{index} {merge:?} is not two tokens separated by a space"
    )]
    BadMerge { index: usize, merge: String },
    #[error("metadata key {key}: token id {id} is outside the vocabulary of {vocab_size}")]
    SpecialIdOutOfRange {
        key: &'static str,
        id: u32,
        vocab_size: usize,
    },
    #[error("building the BPE tokenizer: {0}")]
    Build(#[source] tokenizers::Error),
    #[error("encoding text: {0}")]
    Encode(#[source] tokenizers::Error),
    #[error("token id {id} is outside the vocabulary of {vocab_size}")]
    UnknownId { id: u32, vocab_size: usize },
}

/// Which of llama.cpp's pre-tokenizers a file asks for (the subset implemented here).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum PreTokenizer {
    /// GPT-2's regex only.
    Gpt2,
    /// `\p{N}` isolated first (every digit is its own word), then GPT-2's regex.
    DigitsThenGpt2,
    /// Qwen2's single regex (Llama 3's with one digit per word).
    Qwen2,
}

/// llama.cpp's QWEN2 regex (case-insensitive contractions spelled out, as it does).
const QWEN2_REGEX: &str = r"(?:'[sS]|'[tT]|'[rR][eE]|'[vV][eE]|'[mM]|'[lL][lL]|'[dD])|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+";

impl PreTokenizer {
    fn from_gguf_name(name: &str) -> Option<PreTokenizer> {
        // Mirrors the `regex_exprs` switch in llama.cpp's llama-vocab.cpp: these types use
        // exactly { "\p{N}", GPT-2 regex } or just the GPT-2 regex.
        match name {
            "gpt2" | "mpt" | "olmo" | "jais" | "trillion" => Some(PreTokenizer::Gpt2),
            "smollm" | "starcoder" | "refact" | "command-r" | "codeshell" | "exaone"
            | "minerva" => Some(PreTokenizer::DigitsThenGpt2),
            "qwen2" | "hunyuan" | "solar-open" => Some(PreTokenizer::Qwen2),
            _ => None,
        }
    }

    fn build(self) -> Result<PreTokenizerWrapper, TokenizerError> {
        // ByteLevel(add_prefix_space = false, trim_offsets, use_regex = true) applies GPT-2's
        // regex `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`,
        // the same split llama.cpp's hand-written `unicode_regex_split_custom_gpt2` does.
        let byte_level = ByteLevel::new(false, true, true);
        Ok(match self {
            PreTokenizer::Gpt2 => byte_level.into(),
            // Digits(individual_digits) isolates each \p{N} character, like llama.cpp running
            // "\p{N}" before the GPT-2 regex; the regex then runs within each piece.
            PreTokenizer::DigitsThenGpt2 => {
                Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into()
            }
            // As Qwen2's own tokenizer.json: the regex isolates words, then ByteLevel only
            // maps bytes (no regex of its own).
            PreTokenizer::Qwen2 => {
                let split = Split::new(
                    SplitPattern::Regex(QWEN2_REGEX.into()),
                    SplitDelimiterBehavior::Isolated,
                    false,
                )
                .map_err(TokenizerError::Build)?;
                Sequence::new(vec![
                    split.into(),
                    ByteLevel::new(false, true, false).into(),
                ])
                .into()
            }
        })
    }
}

/// A BPE model shared by the two `tokenizers` pipelines of a [`Tokenizer`], so the
/// vocabulary and merges (about 30 MB for Qwen2's 152k tokens) are held once.
#[derive(Clone)]
struct SharedBpe(Arc<BPE>);

impl Model for SharedBpe {
    type Trainer = BpeTrainer;

    fn tokenize(&self, sequence: &str) -> tokenizers::Result<Vec<Token>> {
        self.0.tokenize(sequence)
    }

    fn token_to_id(&self, token: &str) -> Option<u32> {
        self.0.token_to_id(token)
    }

    fn id_to_token(&self, id: u32) -> Option<String> {
        self.0.id_to_token(id)
    }

    fn get_vocab(&self) -> HashMap<String, u32> {
        self.0.get_vocab()
    }

    fn get_vocab_size(&self) -> usize {
        self.0.get_vocab_size()
    }

    fn save(&self, folder: &Path, prefix: Option<&str>) -> tokenizers::Result<Vec<PathBuf>> {
        self.0.save(folder, prefix)
    }

    fn get_trainer(&self) -> BpeTrainer {
        self.0.get_trainer()
    }
}

type Pipeline = TokenizerImpl<
    SharedBpe,
    NormalizerWrapper,
    PreTokenizerWrapper,
    PostProcessorWrapper,
    DecoderWrapper,
>;

/// A byte-level BPE tokenizer for one model.
pub struct Tokenizer {
    inner: Pipeline,
    /// `inner` with special-token parsing off: control and unknown-type tokens written in
    /// the text are tokenized as ordinary text; user-defined tokens are still recognised,
    /// as llama.cpp does with `parse_special = false`. A second pipeline because the
    /// `tokenizers` crate's switch is per tokenizer, not per call; the BPE model is shared.
    ordinary: Pipeline,
    tokens: Vec<String>,
    /// What each token decodes to, as raw bytes (a token may hold part of a UTF-8 character).
    token_bytes: Vec<Vec<u8>>,
    token_types: Vec<i32>,
    bos: Option<u32>,
    eos: Option<u32>,
    end_of_generation: Vec<u32>,
    add_bos: bool,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("vocab_size", &self.tokens.len())
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .field("add_bos", &self.add_bos)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Builds the tokenizer described by a GGUF file's `tokenizer.ggml.*` metadata.
    pub fn from_gguf(gguf: &Gguf) -> Result<Tokenizer, TokenizerError> {
        let model = gguf.str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(TokenizerError::UnsupportedModel(model.to_owned()));
        }
        // llama.cpp treats a missing `pre` as "default", whose regexes differ from GPT-2's;
        // refusing is better than silently tokenizing differently from the model's training.
        let pre_name = gguf.opt_str("tokenizer.ggml.pre")?.unwrap_or("default");
        let pre = PreTokenizer::from_gguf_name(pre_name)
            .ok_or_else(|| TokenizerError::UnsupportedPreTokenizer(pre_name.to_owned()))?;

        let tokens: Vec<String> = gguf
            .str_array("tokenizer.ggml.tokens")?
            .into_iter()
            .map(str::to_owned)
            .collect();
        let n = tokens.len();
        if u32::try_from(n).is_err() {
            return Err(TokenizerError::VocabTooLarge(n));
        }
        let mut token_types = match gguf.opt_i32_array("tokenizer.ggml.token_type")? {
            Some(t) if t.len() != n => {
                return Err(TokenizerError::TokenTypeCount {
                    tokens: n,
                    types: t.len(),
                });
            }
            Some(t) => t,
            // Without types every token is normal (type 1).
            None => vec![1; n],
        };
        let merges = gguf
            .opt_str_array("tokenizer.ggml.merges")?
            .unwrap_or_default()
            .into_iter()
            .enumerate()
            .map(|(index, m)| {
                m.split_once(' ')
                    .map(|(a, b)| (a.to_owned(), b.to_owned()))
                    .ok_or_else(|| TokenizerError::BadMerge {
                        index,
                        merge: m.to_owned(),
                    })
            })
            .collect::<Result<Vec<_>, _>>()?;

        // Token id = index in the array; if a string repeats, the later id wins, as in
        // llama.cpp's token_to_id map.
        let vocab: Vocab = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();
        let mut end_of_generation: Vec<u32> = END_OF_GENERATION
            .iter()
            .filter_map(|t| vocab.get(*t).copied())
            .collect();
        for &id in &end_of_generation {
            token_types[id as usize] = token_type::CONTROL;
        }
        let bpe = BPE::builder()
            .vocab_and_merges(vocab, merges)
            .build()
            .map_err(TokenizerError::Build)?;
        let mut inner = Pipeline::new(SharedBpe(Arc::new(bpe)));
        inner.with_pre_tokenizer(Some(pre.build()?));
        inner.with_decoder(Some(DecoderWrapper::ByteLevel(ByteLevel::default())));

        // llama.cpp recognises control, unknown-type and user-defined tokens inside text
        // (with parse_special); registering them as added tokens makes the `tokenizers`
        // crate split them out before BPE, so "<|im_start|>" is one id.
        let added: Vec<AddedToken> = tokens
            .iter()
            .zip(&token_types)
            .filter(|(t, _)| !t.is_empty())
            .filter_map(|(t, &ty)| match ty {
                token_type::CONTROL | token_type::UNKNOWN => {
                    Some(AddedToken::from(t.clone(), true))
                }
                token_type::USER_DEFINED => Some(AddedToken::from(t.clone(), false)),
                _ => None,
            })
            .collect();
        let (special, user): (Vec<_>, Vec<_>) = added.into_iter().partition(|t| t.special);
        inner
            .add_special_tokens(special)
            .map_err(TokenizerError::Build)?;
        inner.add_tokens(user).map_err(TokenizerError::Build)?;
        let mut ordinary = inner.clone();
        ordinary.set_encode_special_tokens(true);

        let decoder = byte_decoder();
        let token_bytes = tokens
            .iter()
            .zip(&token_types)
            .map(|(t, &ty)| token_to_bytes(t, ty, &decoder))
            .collect();

        let special_id = |key: &'static str| -> Result<Option<u32>, TokenizerError> {
            match gguf.opt_u32(key)? {
                Some(id) if id as usize >= n => Err(TokenizerError::SpecialIdOutOfRange {
                    key,
                    id,
                    vocab_size: n,
                }),
                other => Ok(other),
            }
        };
        let bos = special_id("tokenizer.ggml.bos_token_id")?;
        let eos = special_id("tokenizer.ggml.eos_token_id")?;
        for id in [eos, special_id("tokenizer.ggml.eot_token_id")?]
            .into_iter()
            .flatten()
        {
            if !end_of_generation.contains(&id) {
                end_of_generation.push(id);
            }
        }
        end_of_generation.sort_unstable();
        // llama.cpp's default for BPE vocabularies is to add no BOS unless the file says so.
        let add_bos = gguf
            .opt_bool("tokenizer.ggml.add_bos_token")?
            .unwrap_or(false);

        tracing::debug!(vocab = n, pre = pre_name, "built tokenizer");
        Ok(Tokenizer {
            inner,
            ordinary,
            tokens,
            token_bytes,
            token_types,
            bos,
            eos,
            end_of_generation,
            add_bos,
        })
    }

    /// Token ids for `text`. Control tokens written in the text ("<|im_start|>") become their
    /// single ids; no BOS is prepended.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self
            .inner
            .encode_fast(text, false)
            .map_err(TokenizerError::Encode)?;
        Ok(enc.get_ids().to_vec())
    }

    /// Token ids for `text` with control tokens written in it treated as ordinary text:
    /// "<|im_start|>" becomes "<", "|", "im", ... and never the control id, so text a user
    /// typed cannot forge a chat turn. No BOS is prepended. For text without control-token
    /// strings the ids equal [`Tokenizer::encode`]'s.
    pub fn encode_ordinary(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        let enc = self
            .ordinary
            .encode_fast(text, false)
            .map_err(TokenizerError::Encode)?;
        Ok(enc.get_ids().to_vec())
    }

    /// Where [`Tokenizer::encode`] cuts special tokens (control and unknown-type) out of
    /// `text`: their byte ranges and ids, in order. The text between them is what it
    /// tokenizes with BPE, piece by piece.
    pub fn special_spans(&self, text: &str) -> Vec<(Range<usize>, u32)> {
        let split = self
            .inner
            .get_added_vocabulary()
            .extract_and_normalize(None::<&NormalizerWrapper>, text);
        split
            .get_splits(OffsetReferential::Original, OffsetType::Byte)
            .into_iter()
            .filter_map(|(_, (start, end), tokens)| match tokens.as_deref() {
                Some([token]) if self.is_special(token.id) => Some((start..end, token.id)),
                _ => None,
            })
            .collect()
    }

    /// The text of `ids`, control tokens included (so encode/decode round-trips). Bytes that
    /// do not form valid UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.decode_inner(ids, false)
    }

    /// Like [`Tokenizer::decode`] but leaving out control tokens (for showing model output).
    pub fn decode_skipping_control(&self, ids: &[u32]) -> Result<String, TokenizerError> {
        self.decode_inner(ids, true)
    }

    fn decode_inner(&self, ids: &[u32], skip_control: bool) -> Result<String, TokenizerError> {
        let mut bytes = Vec::new();
        for &id in ids {
            if skip_control && self.is_control(id) {
                continue;
            }
            bytes.extend_from_slice(self.bytes_of(id)?);
        }
        Ok(String::from_utf8_lossy(&bytes).into_owned())
    }

    /// The raw bytes token `id` stands for.
    pub fn bytes_of(&self, id: u32) -> Result<&[u8], TokenizerError> {
        self.token_bytes
            .get(id as usize)
            .map(Vec::as_slice)
            .ok_or(TokenizerError::UnknownId {
                id,
                vocab_size: self.tokens.len(),
            })
    }

    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// `tokenizer.ggml.bos_token_id`, if the file has one.
    pub fn bos(&self) -> Option<u32> {
        self.bos
    }

    /// `tokenizer.ggml.eos_token_id`, if the file has one.
    pub fn eos(&self) -> Option<u32> {
        self.eos
    }

    /// Tokens that end a generation (end of text, end of turn, ...), sorted: EOS, the file's
    /// EOT, and the vocabulary entries llama.cpp counts as end of generation.
    pub fn end_of_generation(&self) -> &[u32] {
        &self.end_of_generation
    }

    /// Whether prompts should start with BOS (`tokenizer.ggml.add_bos_token`, default false).
    pub fn add_bos_token(&self) -> bool {
        self.add_bos
    }

    /// The id of a vocabulary entry, in its stored form (byte-level: "Ġthe" for " the").
    pub fn id_of(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// The stored form of token `id`.
    pub fn token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// Whether `id` is a control token (token_type 3: "<|im_start|>", "<|endoftext|>", ...).
    pub fn is_control(&self, id: u32) -> bool {
        self.token_types.get(id as usize) == Some(&token_type::CONTROL)
    }

    /// Whether `id` is a special token: one that [`Tokenizer::encode`] recognises in text but
    /// [`Tokenizer::encode_ordinary`] does not (control and unknown-type tokens).
    pub fn is_special(&self, id: u32) -> bool {
        matches!(
            self.token_types.get(id as usize),
            Some(&token_type::CONTROL | &token_type::UNKNOWN)
        )
    }
}

/// GPT-2's reversible byte <-> printable char mapping (`bytes_to_unicode`), inverted: the
/// printable bytes map to themselves, the other 68 to U+0100.. in byte order.
fn byte_decoder() -> HashMap<char, u8> {
    let printable = |b: u8| matches!(b, 0x21..=0x7e | 0xa1..=0xac | 0xae..=0xff);
    let mut map = HashMap::with_capacity(256);
    let mut next = 0x100u32;
    for b in 0..=255u8 {
        let c = if printable(b) {
            char::from(b)
        } else {
            let c = char::from_u32(next).unwrap_or(char::REPLACEMENT_CHARACTER);
            next += 1;
            c
        };
        map.insert(c, b);
    }
    map
}

/// The bytes a token decodes to. Matches the `tokenizers` ByteLevel decoder: a token whose
/// every char is in the byte-level alphabet decodes to those bytes; anything else decodes to
/// its own UTF-8.
fn token_to_bytes(token: &str, ty: i32, decoder: &HashMap<char, u8>) -> Vec<u8> {
    if ty == token_type::CONTROL || ty == token_type::USER_DEFINED {
        // Control/user-defined tokens are stored as plain text. Their chars are ASCII
        // printables in practice, which the mapping leaves unchanged anyway.
        return token.as_bytes().to_vec();
    }
    token
        .chars()
        .map(|c| decoder.get(&c).copied())
        .collect::<Option<Vec<u8>>>()
        .unwrap_or_else(|| token.as_bytes().to_vec())
}

/// Turns a stream of generated token ids into text, emitting only complete UTF-8: a
/// character whose bytes are spread over several tokens comes out whole once its last byte
/// arrives. The concatenation of everything pushed (plus [`StreamDecoder::finish`]) equals
/// [`Tokenizer::decode`] of the whole sequence.
#[derive(Debug, Clone, Default)]
pub struct StreamDecoder {
    /// Bytes of an incomplete trailing UTF-8 sequence (at most 3).
    pending: Vec<u8>,
    skip_control: bool,
}

impl StreamDecoder {
    pub fn new() -> StreamDecoder {
        StreamDecoder::default()
    }

    /// A decoder that emits nothing for control tokens.
    pub fn skipping_control() -> StreamDecoder {
        StreamDecoder {
            pending: Vec::new(),
            skip_control: true,
        }
    }

    /// Adds one token; returns the newly completed text, if any. An id outside the
    /// vocabulary contributes nothing (and is logged); use [`StreamDecoder::try_push`] to
    /// get an error instead.
    pub fn push(&mut self, tok: &Tokenizer, id: u32) -> Option<String> {
        match self.try_push(tok, id) {
            Ok(text) => text,
            Err(e) => {
                tracing::warn!(error = %e, "stream decoder skipped a token");
                None
            }
        }
    }

    pub fn try_push(&mut self, tok: &Tokenizer, id: u32) -> Result<Option<String>, TokenizerError> {
        let bytes = tok.bytes_of(id)?;
        if self.skip_control && tok.is_control(id) {
            return Ok(None);
        }
        self.pending.extend_from_slice(bytes);
        let mut out = String::new();
        let mut rest: &[u8] = &self.pending;
        loop {
            match std::str::from_utf8(rest) {
                Ok(s) => {
                    out.push_str(s);
                    rest = &[];
                    break;
                }
                Err(e) => {
                    let (valid, tail) = rest.split_at(e.valid_up_to());
                    // The prefix was just validated; the lossy call cannot substitute.
                    out.push_str(&String::from_utf8_lossy(valid));
                    match e.error_len() {
                        // An incomplete sequence at the end: wait for more bytes.
                        None => {
                            rest = tail;
                            break;
                        }
                        // Invalid bytes: one U+FFFD per maximal invalid run, as
                        // `String::from_utf8_lossy` does for the whole sequence.
                        Some(n) => {
                            out.push(char::REPLACEMENT_CHARACTER);
                            rest = tail.get(n..).unwrap_or_default();
                        }
                    }
                }
            }
        }
        self.pending = rest.to_vec();
        Ok((!out.is_empty()).then_some(out))
    }

    /// Ends the stream: an incomplete trailing character becomes U+FFFD.
    pub fn finish(&mut self) -> Option<String> {
        if self.pending.is_empty() {
            return None;
        }
        let text = String::from_utf8_lossy(&self.pending).into_owned();
        self.pending.clear();
        Some(text)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::Value;
    use crate::gguf::testutil::{GgufBuilder, large_test_model, test_model};
    use std::path::Path;
    use std::sync::OnceLock;

    fn token_type_histogram(tok: &Tokenizer) -> HashMap<i32, usize> {
        let mut h = HashMap::new();
        for &t in &tok.token_types {
            *h.entry(t).or_default() += 1;
        }
        h
    }

    fn byte_token(t: &Tokenizer, b: u8) -> u32 {
        let (c, _) = byte_decoder().into_iter().find(|&(_, v)| v == b).unwrap();
        t.id_of(&c.to_string()).unwrap()
    }

    fn tok() -> &'static Tokenizer {
        static TOK: OnceLock<Tokenizer> = OnceLock::new();
        TOK.get_or_init(|| Tokenizer::from_gguf(test_model()).unwrap())
    }

    /// Ids from llama.cpp (llama-cpp-python 0.3.36, `Llama(vocab_only=True).tokenize(text,
    /// add_bos=False, special=True)`) for SmolLM2-135M-Instruct.Q4_1.gguf.
    const REFERENCE: &[(&str, &[u32])] = &[
        ("Hello, world!", &[19556, 28, 905, 17]),
        (
            "The capital of France is Paris.",
            &[504, 3575, 282, 4649, 314, 7042, 30],
        ),
        (
            "  leading spaces and\nnewlines\t tabs",
            &[216, 2899, 5600, 284, 198, 2241, 5110, 197, 29416],
        ),
        (
            "émoji 🙂 and 中文",
            &[2756, 15771, 10381, 47526, 284, 216, 28589, 29184],
        ),
        (
            "<|im_start|>user\nHi<|im_end|>\n",
            &[1, 4093, 198, 26843, 2, 198],
        ),
        (
            "12345 + 678 = 13023",
            &[
                33, 34, 35, 36, 37, 1232, 216, 38, 39, 40, 446, 216, 33, 35, 32, 34, 35,
            ],
        ),
    ];

    #[test]
    fn matches_llama_cpp_reference_ids() {
        let t = tok();
        for &(text, ids) in REFERENCE {
            assert_eq!(t.encode(text).unwrap(), ids, "encoding {text:?}");
            assert_eq!(t.decode(ids).unwrap(), text, "decoding {text:?}");
        }
    }

    /// A wider differential check: 347 strings (fixed edge cases plus seeded random mixes of
    /// ASCII, accents, CJK, emoji, combining marks, non-ASCII digits and odd whitespace) with
    /// their llama.cpp ids, generated with the same llama-cpp-python call as `REFERENCE`.
    #[test]
    fn matches_llama_cpp_on_fixture_corpus() {
        check_fixture(tok(), "smollm2_llama_cpp_tokens.tsv");
    }

    /// The same strings through Qwen2's pre-tokenizer (one regex, single digits), against
    /// llama.cpp's llama-server `/tokenize` on the larger tier's GGUF.
    #[test]
    fn qwen2_matches_llama_cpp_on_fixture_corpus() {
        let t = Tokenizer::from_gguf(large_test_model()).unwrap();
        assert_eq!(t.vocab_size(), 151936);
        assert_eq!(t.eos(), t.id_of("<|im_end|>"));
        // <|endoftext|>, </s> (stored as a normal token), the FIM separators, <|im_end|>.
        let eog: Vec<&str> = t
            .end_of_generation()
            .iter()
            .map(|&id| t.token(id).unwrap())
            .collect();
        assert_eq!(
            eog,
            [
                "</s>",
                "<|endoftext|>",
                "<|im_end|>",
                "<|fim_pad|>",
                "<|repo_name|>",
                "<|file_sep|>"
            ]
        );
        check_fixture(&t, "qwen2_llama_cpp_tokens.tsv");
    }

    fn check_fixture(t: &Tokenizer, file: &str) {
        let path = Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("tests/data")
            .join(file);
        let data = std::fs::read_to_string(path).unwrap();
        let mut mismatches = Vec::new();
        let mut n = 0;
        for line in data.lines().filter(|l| !l.starts_with('#')) {
            let (hex, ids) = line.split_once('\t').unwrap();
            let bytes: Vec<u8> = (0..hex.len())
                .step_by(2)
                .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
                .collect();
            let text = String::from_utf8(bytes).unwrap();
            let want: Vec<u32> = ids
                .split(',')
                .filter(|s| !s.is_empty())
                .map(|s| s.parse().unwrap())
                .collect();
            let got = t.encode(&text).unwrap();
            if got != want {
                mismatches.push(format!("{text:?}: llama.cpp {want:?}, ours {got:?}"));
            }
            assert_eq!(t.decode(&got).unwrap(), text);
            n += 1;
        }
        assert!(n > 300);
        assert!(
            mismatches.is_empty(),
            "{} of {n} differ:\n{}",
            mismatches.len(),
            mismatches.join("\n")
        );
    }

    #[test]
    fn special_ids_and_vocab() {
        let t = tok();
        assert_eq!(t.vocab_size(), 49152);
        assert_eq!(t.bos(), Some(1));
        assert_eq!(t.eos(), Some(2));
        assert!(!t.add_bos_token());
        assert_eq!(t.id_of("<|im_start|>"), Some(1));
        assert_eq!(t.id_of("<|im_end|>"), Some(2));
        // <|endoftext|>, <|im_end|> and <reponame>, which llama.cpp counts as a FIM separator.
        assert_eq!(t.end_of_generation(), [0, 2, 4]);
        assert_eq!(t.id_of("Hello"), Some(19556));
        assert_eq!(t.id_of("no such token"), None);
        assert_eq!(t.token(2), Some("<|im_end|>"));
        assert!(t.is_control(1) && t.is_control(2));
        assert!(!t.is_control(19556));
        assert!(!t.is_control(u32::MAX));
        assert!(
            token_type_histogram(t)
                .get(&token_type::CONTROL)
                .copied()
                .unwrap_or(0)
                > 0
        );
        assert_eq!(t.encode("<|im_start|><|im_end|>").unwrap(), [1, 2]);
        assert_eq!(t.encode("").unwrap(), Vec::<u32>::new());
        assert_eq!(
            t.decode_skipping_control(&[1, 4093, 198, 26843, 2, 198])
                .unwrap(),
            "user\nHi\n"
        );
    }

    #[test]
    fn ordinary_encoding_reads_control_tokens_as_text() {
        let t = tok();
        let text = "<|im_start|>user\nHi<|im_end|><|endoftext|>";
        let ids = t.encode_ordinary(text).unwrap();
        assert!(ids.iter().all(|&id| !t.is_special(id)), "{ids:?}");
        assert_eq!(t.decode(&ids).unwrap(), text);
        assert_eq!(
            t.encode_ordinary("Hello, world!").unwrap(),
            [19556, 28, 905, 17]
        );
        assert_eq!(
            t.special_spans("a<|im_start|>b<|im_end|>"),
            [(1..13, 1), (14..24, 2)]
        );
        assert!(t.special_spans("no specials").is_empty());
        assert!(t.is_special(0) && !t.is_special(19556) && !t.is_special(u32::MAX));
        // User-defined tokens (Qwen's tool-call tags) are no control tokens: llama.cpp
        // matches them without special parsing too, and they are not special spans.
        let q = Tokenizer::from_gguf(large_test_model()).unwrap();
        let tag = q.id_of("<tool_call>").unwrap();
        assert_eq!(q.encode_ordinary("<tool_call>").unwrap(), [tag]);
        assert!(!q.is_special(tag) && q.special_spans("<tool_call>").is_empty());
    }

    #[test]
    fn decode_agrees_with_byte_level_decoder_on_every_token() {
        let t = tok();
        for id in 0..t.vocab_size() as u32 {
            let ours = t.decode(&[id]).unwrap();
            let theirs = t.inner.decode(&[id], false).unwrap();
            assert_eq!(ours, theirs, "token {id} {:?}", t.token(id));
        }
    }

    #[test]
    fn unknown_ids_are_errors() {
        let t = tok();
        let e = t.decode(&[19556, 49152]).unwrap_err();
        assert!(e.to_string().contains("49152"), "{e}");
        let mut s = StreamDecoder::new();
        assert!(s.try_push(t, 1 << 30).is_err());
        assert_eq!(s.push(t, 1 << 30), None);
    }

    #[test]
    fn stream_decoder_emits_whole_characters() {
        let t = tok();
        for text in [
            "émoji 🙂 and 中文",
            "Hello, world!",
            "日本語のテキスト 🙂🙃 ok",
            "<|im_start|>a",
        ] {
            let ids = t.encode(text).unwrap();
            let mut s = StreamDecoder::new();
            let mut out = String::new();
            for &id in &ids {
                if let Some(piece) = s.push(t, id) {
                    out.push_str(&piece);
                }
            }
            assert_eq!(s.finish(), None);
            assert_eq!(out, text);
        }
        // Feed "🙂" one byte-token at a time: nothing until the fourth byte.
        let byte_ids: Vec<u32> = "🙂".bytes().map(|b| byte_token(t, b)).collect();
        let mut s = StreamDecoder::new();
        let got: Vec<_> = byte_ids.iter().map(|&id| s.push(t, id)).collect();
        assert_eq!(got, [None, None, None, Some("🙂".to_owned())]);
        // A split character followed by something that does not continue it: U+FFFD, then
        // the rest, exactly as whole-sequence decoding gives.
        let seq = [
            byte_ids[0],
            byte_ids[1],
            t.id_of("Hello").unwrap(),
            byte_ids[0],
        ];
        let mut s = StreamDecoder::new();
        let mut out: String = seq.iter().filter_map(|&id| s.push(t, id)).collect();
        out.extend(s.finish());
        assert_eq!(out, t.decode(&seq).unwrap());
        assert_eq!(out, "\u{FFFD}Hello\u{FFFD}");
        let mut s = StreamDecoder::skipping_control();
        assert_eq!(s.push(t, 1), None);
        assert_eq!(s.push(t, 19556).as_deref(), Some("Hello"));
    }

    #[test]
    fn byte_mapping_is_gpt2s() {
        // Spot checks of bytes_to_unicode: 'Ġ' is space, 'Ċ' newline, 'ĉ' tab.
        let d = byte_decoder();
        assert_eq!(d.get(&'Ġ'), Some(&b' '));
        assert_eq!(d.get(&'Ċ'), Some(&b'\n'));
        assert_eq!(d.get(&'ĉ'), Some(&b'\t'));
        assert_eq!(d.get(&'A'), Some(&b'A'));
        assert_eq!(d.get(&'\u{ad}'), None);
        assert_eq!(d.get(&' '), None);
        let mut all: Vec<u8> = d.values().copied().collect();
        all.sort_unstable();
        assert_eq!(all, (0..=255).collect::<Vec<u8>>());
    }

    fn tiny(model: &str, pre: Option<&str>) -> Gguf {
        let mut b = GgufBuilder::new()
            .kv("tokenizer.ggml.model", Value::String(model.into()))
            .kv(
                "tokenizer.ggml.tokens",
                Value::Array(vec![Value::String("a".into()), Value::String("b".into())]),
            );
        if let Some(p) = pre {
            b = b.kv("tokenizer.ggml.pre", Value::String(p.into()));
        }
        Gguf::parse(b.build()).unwrap()
    }

    #[test]
    fn unsupported_tokenizers_are_named() {
        let e = Tokenizer::from_gguf(&tiny("llama", None)).unwrap_err();
        assert!(e.to_string().contains("\"llama\""), "{e}");
        let e = Tokenizer::from_gguf(&tiny("gpt2", Some("deepseek-llm"))).unwrap_err();
        assert!(e.to_string().contains("\"deepseek-llm\""), "{e}");
        let e = Tokenizer::from_gguf(&tiny("gpt2", None)).unwrap_err();
        assert!(e.to_string().contains("\"default\""), "{e}");
        let e =
            Tokenizer::from_gguf(&Gguf::parse(GgufBuilder::new().build()).unwrap()).unwrap_err();
        assert!(e.to_string().contains("tokenizer.ggml.model"), "{e}");
        // A minimal gpt2 vocabulary without merges still works, character by character.
        let t = Tokenizer::from_gguf(&tiny("gpt2", Some("gpt2"))).unwrap();
        assert_eq!(t.encode("abba").unwrap(), [0, 1, 1, 0]);
        assert_eq!(t.bos(), None);
    }
}
