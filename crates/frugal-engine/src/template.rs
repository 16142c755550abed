//! Chat templates: turning a list of chat messages into the prompt text a model was trained
//! on, by rendering the Jinja template stored in the GGUF file (`tokenizer.chat_template`).
//!
//! Templates are written for Hugging Face's Python renderer, so the environment here mimics
//! it: `trim_blocks` and `lstrip_blocks` on, `bos_token`/`eos_token` variables, the
//! `raise_exception` and `strftime_now` functions, a `tojson` filter, and the handful of
//! Python string/dict methods templates commonly call (`.strip()`, `.startswith()`,
//! `.items()`, ...). A file without a template gets ChatML, flagged by
//! [`ChatTemplate::is_fallback`].

use std::collections::BTreeMap;
use std::fmt::Write as _;

use minijinja::value::{Kwargs, ValueKind, from_args};
use minijinja::{Environment, Error, ErrorKind, State, Value};
use thiserror::Error;

use crate::gguf::{Gguf, GgufError};

/// ChatML, for files that carry no template: the most common format among small chat models.
pub const CHATML_TEMPLATE: &str = "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}";

const TEMPLATE_NAME: &str = "chat_template";

#[derive(Debug, Error)]
pub enum TemplateError {
    #[error(transparent)]
    Gguf(#[from] GgufError),
    #[error("the chat template does not compile: {0}")]
    Compile(String),
    #[error("rendering the chat template failed: {0}")]
    Render(String),
}

/// One chat message.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Message {
    pub role: String,
    pub content: String,
}

impl Message {
    pub fn new(role: impl Into<String>, content: impl Into<String>) -> Message {
        Message {
            role: role.into(),
            content: content.into(),
        }
    }

    pub fn system(content: impl Into<String>) -> Message {
        Message::new("system", content)
    }

    pub fn user(content: impl Into<String>) -> Message {
        Message::new("user", content)
    }

    pub fn assistant(content: impl Into<String>) -> Message {
        Message::new("assistant", content)
    }
}

/// A compiled chat template.
pub struct ChatTemplate {
    env: Environment<'static>,
    source: String,
    fallback: bool,
    bos_token: String,
    eos_token: String,
}

impl std::fmt::Debug for ChatTemplate {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ChatTemplate")
            .field("fallback", &self.fallback)
            .field("bos_token", &self.bos_token)
            .field("eos_token", &self.eos_token)
            .field("source_len", &self.source.len())
            .finish_non_exhaustive()
    }
}

impl ChatTemplate {
    /// The file's `tokenizer.chat_template`, or ChatML when it has none. `bos_token` and
    /// `eos_token` are the vocabulary entries of the file's BOS/EOS ids.
    pub fn from_gguf(gguf: &Gguf) -> Result<ChatTemplate, TemplateError> {
        let special = |key: &str| -> Result<String, TemplateError> {
            let Some(id) = gguf.opt_u32(key)? else {
                return Ok(String::new());
            };
            let tokens = gguf
                .opt_str_array("tokenizer.ggml.tokens")?
                .unwrap_or_default();
            Ok(tokens
                .get(id as usize)
                .map(|t| t.to_string())
                .unwrap_or_default())
        };
        let bos = special("tokenizer.ggml.bos_token_id")?;
        let eos = special("tokenizer.ggml.eos_token_id")?;
        match gguf.opt_str("tokenizer.chat_template")? {
            Some(source) => ChatTemplate::new(source, bos, eos),
            None => {
                tracing::warn!(
                    path = ?gguf.path(),
                    "GGUF has no tokenizer.chat_template; falling back to ChatML"
                );
                let mut t = ChatTemplate::new(CHATML_TEMPLATE, bos, eos)?;
                t.fallback = true;
                Ok(t)
            }
        }
    }

    /// Compiles a template from source.
    pub fn new(
        source: impl Into<String>,
        bos_token: impl Into<String>,
        eos_token: impl Into<String>,
    ) -> Result<ChatTemplate, TemplateError> {
        let source = source.into();
        let mut env = Environment::new();
        // Hugging Face renders with trim_blocks and lstrip_blocks; templates rely on it.
        let syntax = minijinja::syntax::SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .build()
            .map_err(|e| TemplateError::Compile(describe(&e)))?;
        env.set_syntax(syntax);
        env.add_function("raise_exception", raise_exception);
        env.add_function("strftime_now", strftime_now);
        env.add_filter("tojson", tojson);
        env.set_unknown_method_callback(python_methods);
        env.add_template_owned(TEMPLATE_NAME, source.clone())
            .map_err(|e| TemplateError::Compile(describe(&e)))?;
        Ok(ChatTemplate {
            env,
            source,
            fallback: false,
            bos_token: bos_token.into(),
            eos_token: eos_token.into(),
        })
    }

    /// Whether this is the ChatML fallback because the file had no template.
    pub fn is_fallback(&self) -> bool {
        self.fallback
    }

    /// The template source.
    pub fn source(&self) -> &str {
        &self.source
    }

    /// The prompt text for `messages`; with `add_generation_prompt` it ends with the opening
    /// of an assistant turn, ready for generation.
    pub fn render(
        &self,
        messages: &[Message],
        add_generation_prompt: bool,
    ) -> Result<String, TemplateError> {
        let messages: Vec<Value> = messages
            .iter()
            .map(|m| {
                let mut map = BTreeMap::new();
                map.insert("role".to_owned(), Value::from(m.role.as_str()));
                map.insert("content".to_owned(), Value::from(m.content.as_str()));
                Value::from(map)
            })
            .collect();
        let tmpl = self
            .env
            .get_template(TEMPLATE_NAME)
            .map_err(|e| TemplateError::Render(describe(&e)))?;
        tmpl.render(minijinja::context! {
            messages => messages,
            add_generation_prompt => add_generation_prompt,
            bos_token => self.bos_token.as_str(),
            eos_token => self.eos_token.as_str(),
        })
        .map_err(|e| TemplateError::Render(describe(&e)))
    }
}

/// A minijinja error with its chain of causes on one line.
fn describe(e: &Error) -> String {
    let mut s = e.to_string();
    let mut source = std::error::Error::source(e);
    while let Some(cause) = source {
        let _ = write!(s, ": {cause}");
        source = cause.source();
    }
    s
}

/// `raise_exception(msg)`: templates call it to reject conversations they cannot format.
fn raise_exception(msg: String) -> Result<Value, Error> {
    Err(Error::new(
        ErrorKind::InvalidOperation,
        format!("template raised an exception: {msg}"),
    ))
}

/// `strftime_now(format)`: the current UTC time, with the common strftime conversions.
fn strftime_now(format: String) -> Result<Value, Error> {
    let secs = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0);
    Ok(Value::from(strftime(&format, secs)))
}

fn strftime(format: &str, unix_secs: u64) -> String {
    const MONTHS: [&str; 12] = [
        "January",
        "February",
        "March",
        "April",
        "May",
        "June",
        "July",
        "August",
        "September",
        "October",
        "November",
        "December",
    ];
    const DAYS: [&str; 7] = [
        "Monday",
        "Tuesday",
        "Wednesday",
        "Thursday",
        "Friday",
        "Saturday",
        "Sunday",
    ];
    let days = (unix_secs / 86_400) as i64;
    let tod = unix_secs % 86_400;
    let (year, month, day) = civil_from_days(days);
    // 1970-01-01 was a Thursday (index 3 with Monday = 0).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let (hour, minute, second) = (tod / 3600, tod / 60 % 60, tod % 60);
    let month_name = MONTHS.get(month as usize - 1).copied().unwrap_or("");
    let day_name = DAYS.get(weekday).copied().unwrap_or("");
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let _ = match chars.next() {
            Some('Y') => write!(out, "{year}"),
            Some('y') => write!(out, "{:02}", year.rem_euclid(100)),
            Some('m') => write!(out, "{month:02}"),
            Some('d') => write!(out, "{day:02}"),
            Some('e') => write!(out, "{day:2}"),
            Some('-') if chars.clone().next() == Some('d') => {
                chars.next();
                write!(out, "{day}")
            }
            Some('H') => write!(out, "{hour:02}"),
            Some('I') => write!(out, "{:02}", (hour + 11) % 12 + 1),
            Some('p') => write!(out, "{}", if hour < 12 { "AM" } else { "PM" }),
            Some('M') => write!(out, "{minute:02}"),
            Some('S') => write!(out, "{second:02}"),
            Some('B') => write!(out, "{month_name}"),
            Some('b') | Some('h') => write!(out, "{}", month_name.get(..3).unwrap_or("")),
            Some('A') => write!(out, "{day_name}"),
            Some('a') => write!(out, "{}", day_name.get(..3).unwrap_or("")),
            Some('%') => write!(out, "%"),
            // Unknown conversions are kept as written, as glibc does.
            Some(other) => write!(out, "%{other}"),
            None => write!(out, "%"),
        };
    }
    out
}

/// (year, month 1-12, day 1-31) for days since 1970-01-01 (Howard Hinnant's algorithm).
fn civil_from_days(z: i64) -> (i64, u32, u32) {
    let z = z + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let y = yoe + era * 400;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (if m <= 2 { y + 1 } else { y }, m, d)
}

/// `value|tojson`: JSON like Python's `json.dumps(value, ensure_ascii=False)`, which is what
/// Hugging Face's renderer does (separators ", " and ": "; `indent=N` pretty-prints).
fn tojson(value: &Value, kwargs: Kwargs) -> Result<Value, Error> {
    let indent: Option<usize> = kwargs.get("indent")?;
    let ensure_ascii: Option<bool> = kwargs.get("ensure_ascii")?;
    // Maps iterate in key order already; accept the flag for compatibility.
    let _sort_keys: Option<bool> = kwargs.get("sort_keys")?;
    kwargs.assert_all_used()?;
    let mut out = String::new();
    let opts = JsonOpts {
        indent,
        ensure_ascii: ensure_ascii.unwrap_or(false),
    };
    write_json(&mut out, value, opts, 0)?;
    Ok(Value::from_safe_string(out))
}

#[derive(Clone, Copy)]
struct JsonOpts {
    indent: Option<usize>,
    ensure_ascii: bool,
}

/// Nesting limit for `tojson`, so a self-referencing object cannot recurse forever.
const MAX_JSON_DEPTH: usize = 64;

fn write_json(out: &mut String, v: &Value, opts: JsonOpts, depth: usize) -> Result<(), Error> {
    if depth > MAX_JSON_DEPTH {
        return Err(Error::new(
            ErrorKind::InvalidOperation,
            "tojson: value nested too deeply",
        ));
    }
    let newline = |out: &mut String, level: usize| {
        if let Some(n) = opts.indent {
            out.push('\n');
            out.extend(std::iter::repeat_n(' ', n * level));
        }
    };
    let item_sep = if opts.indent.is_some() { "," } else { ", " };
    match v.kind() {
        ValueKind::Undefined | ValueKind::None => out.push_str("null"),
        ValueKind::Bool => out.push_str(if v.is_true() { "true" } else { "false" }),
        // minijinja prints numbers the way Python does (1, 1.5, 2.0), which is also JSON.
        ValueKind::Number => {
            let _ = write!(out, "{v}");
        }
        ValueKind::String => json_string(out, v.as_str().unwrap_or(""), opts.ensure_ascii),
        ValueKind::Bytes => json_string(
            out,
            &String::from_utf8_lossy(v.as_bytes().unwrap_or_default()),
            opts.ensure_ascii,
        ),
        ValueKind::Seq | ValueKind::Iterable => {
            let items: Vec<Value> = v.try_iter()?.collect();
            if items.is_empty() {
                out.push_str("[]");
                return Ok(());
            }
            out.push('[');
            for (i, item) in items.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                write_json(out, item, opts, depth + 1)?;
            }
            newline(out, depth);
            out.push(']');
        }
        ValueKind::Map => {
            let keys: Vec<Value> = v.try_iter()?.collect();
            if keys.is_empty() {
                out.push_str("{}");
                return Ok(());
            }
            out.push('{');
            for (i, key) in keys.iter().enumerate() {
                if i > 0 {
                    out.push_str(item_sep);
                }
                newline(out, depth + 1);
                // JSON keys are strings; Python stringifies numbers and bools the same way.
                match key.as_str() {
                    Some(s) => json_string(out, s, opts.ensure_ascii),
                    None => json_string(out, &key.to_string(), opts.ensure_ascii),
                }
                out.push_str(": ");
                write_json(out, &v.get_item(key)?, opts, depth + 1)?;
            }
            newline(out, depth);
            out.push('}');
        }
        _ => {
            return Err(Error::new(
                ErrorKind::InvalidOperation,
                format!("tojson: cannot serialize a {} value", v.kind()),
            ));
        }
    }
    Ok(())
}

fn json_string(out: &mut String, s: &str, ensure_ascii: bool) {
    out.push('"');
    for c in s.chars() {
        match c {
            '"' => out.push_str("\\\""),
            '\\' => out.push_str("\\\\"),
            '\n' => out.push_str("\\n"),
            '\r' => out.push_str("\\r"),
            '\t' => out.push_str("\\t"),
            '\u{8}' => out.push_str("\\b"),
            '\u{c}' => out.push_str("\\f"),
            c if (c as u32) < 0x20 || (ensure_ascii && !c.is_ascii()) => {
                let mut buf = [0u16; 2];
                for unit in c.encode_utf16(&mut buf) {
                    let _ = write!(out, "\\u{unit:04x}");
                }
            }
            c => out.push(c),
        }
    }
    out.push('"');
}

/// The Python `str` and `dict` methods that chat templates call, which minijinja (a Jinja
/// engine, not a Python one) lacks.
fn python_methods(
    state: &mut State,
    value: &Value,
    method: &str,
    args: &[Value],
) -> Result<Value, Error> {
    if let Some(s) = value.as_str() {
        return match method {
            "strip" | "lstrip" | "rstrip" => {
                let (chars,): (Option<&str>,) = from_args(args)?;
                let pat = |c: char| match chars {
                    Some(set) => set.contains(c),
                    None => c.is_whitespace(),
                };
                Ok(Value::from(match method {
                    "strip" => s.trim_matches(pat),
                    "lstrip" => s.trim_start_matches(pat),
                    _ => s.trim_end_matches(pat),
                }))
            }
            "startswith" | "endswith" => {
                let (prefix,): (Value,) = from_args(args)?;
                // Python accepts a tuple of alternatives as well as a single string.
                let candidates: Vec<Value> = if prefix.kind() == ValueKind::String {
                    vec![prefix]
                } else {
                    prefix.try_iter()?.collect()
                };
                let hit = candidates.iter().filter_map(Value::as_str).any(|p| {
                    if method == "startswith" {
                        s.starts_with(p)
                    } else {
                        s.ends_with(p)
                    }
                });
                Ok(Value::from(hit))
            }
            "split" | "rsplit" => {
                let (sep, maxsplit): (Option<&str>, Option<i64>) = from_args(args)?;
                Ok(Value::from(py_split(s, sep, maxsplit, method == "rsplit")?))
            }
            "upper" | "lower" | "title" | "capitalize" => {
                let _: () = from_args(args)?;
                state.apply_filter(method, std::slice::from_ref(value))
            }
            "replace" => {
                let (old, new, count): (&str, &str, Option<i64>) = from_args(args)?;
                Ok(Value::from(match count {
                    Some(n) if n >= 0 => s.replacen(old, new, n as usize),
                    _ => s.replace(old, new),
                }))
            }
            "find" => {
                let (needle,): (&str,) = from_args(args)?;
                // Python counts characters, not bytes.
                Ok(Value::from(
                    s.find(needle).map_or(-1, |b| s[..b].chars().count() as i64),
                ))
            }
            "count" => {
                let (needle,): (&str,) = from_args(args)?;
                Ok(Value::from(if needle.is_empty() {
                    s.chars().count() + 1
                } else {
                    s.matches(needle).count()
                }))
            }
            _ => Err(Error::from(ErrorKind::UnknownMethod)),
        };
    }
    if value.kind() == ValueKind::Map {
        return match method {
            "items" => {
                let _: () = from_args(args)?;
                state.apply_filter("items", std::slice::from_ref(value))
            }
            "keys" => {
                let _: () = from_args(args)?;
                Ok(Value::from(value.try_iter()?.collect::<Vec<_>>()))
            }
            "values" => {
                let _: () = from_args(args)?;
                let keys: Vec<Value> = value.try_iter()?.collect();
                let values = keys
                    .iter()
                    .map(|k| value.get_item(k))
                    .collect::<Result<Vec<_>, _>>()?;
                Ok(Value::from(values))
            }
            "get" => {
                let (key, default): (Value, Option<Value>) = from_args(args)?;
                let v = value.get_item(&key)?;
                Ok(if v.is_undefined() {
                    default.unwrap_or(Value::from(()))
                } else {
                    v
                })
            }
            _ => Err(Error::from(ErrorKind::UnknownMethod)),
        };
    }
    Err(Error::from(ErrorKind::UnknownMethod))
}

/// Python's `str.split` / `str.rsplit`.
fn py_split(
    s: &str,
    sep: Option<&str>,
    maxsplit: Option<i64>,
    from_right: bool,
) -> Result<Vec<String>, Error> {
    let max = maxsplit.filter(|&n| n >= 0).map(|n| n as usize);
    match sep {
        Some("") => Err(Error::new(ErrorKind::InvalidOperation, "empty separator")),
        // No separator: split on runs of whitespace, ignoring it at the ends, except that
        // once `maxsplit` is reached the remainder is kept as is.
        None => {
            let mut out = Vec::new();
            if from_right {
                let mut rest = s.trim_end();
                while !rest.is_empty() {
                    if max == Some(out.len()) {
                        out.push(rest.to_owned());
                        break;
                    }
                    let start = rest
                        .char_indices()
                        .rev()
                        .find(|(_, c)| c.is_whitespace())
                        .map_or(0, |(i, c)| i + c.len_utf8());
                    out.push(rest[start..].to_owned());
                    rest = rest[..start].trim_end();
                }
                out.reverse();
            } else {
                let mut rest = s.trim_start();
                while !rest.is_empty() {
                    if max == Some(out.len()) {
                        out.push(rest.to_owned());
                        break;
                    }
                    let end = rest.find(char::is_whitespace).unwrap_or(rest.len());
                    out.push(rest[..end].to_owned());
                    rest = rest[end..].trim_start();
                }
            }
            Ok(out)
        }
        Some(sep) => Ok(match (max, from_right) {
            (Some(n), false) => s.splitn(n + 1, sep).map(str::to_owned).collect(),
            (Some(n), true) => {
                let mut v: Vec<String> = s.rsplitn(n + 1, sep).map(str::to_owned).collect();
                v.reverse();
                v
            }
            (None, _) => s.split(sep).map(str::to_owned).collect(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::Value as GValue;
    use crate::gguf::testutil::{GgufBuilder, test_model};

    const SMOL_SYSTEM: &str = "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n";

    #[test]
    fn smollm2_user_only() {
        let t = ChatTemplate::from_gguf(test_model()).unwrap();
        assert!(!t.is_fallback());
        let msgs = [Message::user("Hi")];
        let want = format!("{SMOL_SYSTEM}<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n");
        assert_eq!(t.render(&msgs, true).unwrap(), want);
        let want = format!("{SMOL_SYSTEM}<|im_start|>user\nHi<|im_end|>\n");
        assert_eq!(t.render(&msgs, false).unwrap(), want);
    }

    #[test]
    fn smollm2_full_conversation() {
        let t = ChatTemplate::from_gguf(test_model()).unwrap();
        let msgs = [
            Message::system("Be brief."),
            Message::user("What is 2+2?"),
            Message::assistant("4"),
            Message::user("And 3+3?"),
        ];
        let want = "<|im_start|>system\nBe brief.<|im_end|>\n\
                    <|im_start|>user\nWhat is 2+2?<|im_end|>\n\
                    <|im_start|>assistant\n4<|im_end|>\n\
                    <|im_start|>user\nAnd 3+3?<|im_end|>\n\
                    <|im_start|>assistant\n";
        assert_eq!(t.render(&msgs, true).unwrap(), want);
        // The prompt tokenizes with the chat markers as single control tokens.
        let tok = crate::tokenizer::Tokenizer::from_gguf(test_model()).unwrap();
        let ids = tok.encode(&t.render(&msgs, true).unwrap()).unwrap();
        assert_eq!(ids.first(), Some(&1));
        assert_eq!(ids.iter().filter(|&&id| id == 2).count(), 4);
    }

    #[test]
    fn missing_template_falls_back_to_chatml() {
        let g = Gguf::parse(GgufBuilder::new().build()).unwrap();
        let t = ChatTemplate::from_gguf(&g).unwrap();
        assert!(t.is_fallback());
        let out = t
            .render(&[Message::system("S"), Message::user("U")], true)
            .unwrap();
        assert_eq!(
            out,
            "<|im_start|>system\nS<|im_end|>\n<|im_start|>user\nU<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn bos_eos_come_from_the_vocabulary() {
        let g = Gguf::parse(
            GgufBuilder::new()
                .kv(
                    "tokenizer.ggml.tokens",
                    GValue::Array(vec![GValue::String("<s>".into()), GValue::String("</s>".into())]),
                )
                .kv("tokenizer.ggml.bos_token_id", GValue::U32(0))
                .kv("tokenizer.ggml.eos_token_id", GValue::U32(1))
                .kv(
                    "tokenizer.chat_template",
                    GValue::String("{{ bos_token }}{% for m in messages %}{{ m.content }}{{ eos_token }}{% endfor %}".into()),
                )
                .build(),
        )
        .unwrap();
        let t = ChatTemplate::from_gguf(&g).unwrap();
        assert_eq!(t.render(&[Message::user("x")], false).unwrap(), "<s>x</s>");
    }

    #[test]
    fn failures_are_clear_errors() {
        let e = ChatTemplate::new("{% for %}", "", "").unwrap_err();
        assert!(matches!(e, TemplateError::Compile(_)), "{e}");
        let t = ChatTemplate::new(
            "{% if messages[0].role != 'system' %}{{ raise_exception('first message must be system') }}{% endif %}",
            "",
            "",
        )
        .unwrap();
        let e = t.render(&[Message::user("x")], false).unwrap_err();
        let msg = e.to_string();
        assert!(msg.contains("rendering the chat template failed"), "{msg}");
        assert!(msg.contains("first message must be system"), "{msg}");
        let t = ChatTemplate::new("{{ messages[0].content.nosuchmethod() }}", "", "").unwrap();
        assert!(t.render(&[Message::user("x")], false).is_err());
    }

    #[test]
    fn hf_compat_extras() {
        let src = "{%- for m in messages -%}\n\
                   {{ m.content.strip() }}|{{ m.role.startswith('us') }}|{{ m.content.split(',') | length }}\n\
                   {% endfor -%}\n\
                   {{ messages[0] | tojson }}\n\
                   {% for k, v in messages[0].items() %}{{ k }}={{ v.upper() }};{% endfor %}\n\
                   {{ {'a': [1, 2.5, none, true], 'b': 'q\"\\n'} | tojson }}\n\
                   {{ messages[0].get('missing', 'dflt') }}";
        // Expected output checked against Jinja2 3.1.6 (ImmutableSandboxedEnvironment with
        // trim_blocks and lstrip_blocks, tojson = json.dumps), as transformers renders.
        let t = ChatTemplate::new(src, "", "").unwrap();
        let out = t.render(&[Message::user("  a,b,c  ")], false).unwrap();
        let want = "a,b,c|True|3\n\
                    {\"content\": \"  a,b,c  \", \"role\": \"user\"}\n\
                    content=  A,B,C  ;role=USER;\
                    {\"a\": [1, 2.5, null, true], \"b\": \"q\\\"\\n\"}\n\
                    dflt";
        assert_eq!(out, want);
        let t = ChatTemplate::new("{{ messages | tojson(indent=2) }}", "", "").unwrap();
        assert_eq!(
            t.render(&[Message::user("é")], false).unwrap(),
            "[\n  {\n    \"content\": \"é\",\n    \"role\": \"user\"\n  }\n]"
        );
        // trim_blocks / lstrip_blocks, as in Hugging Face's renderer.
        let t = ChatTemplate::new("  {% if true %}\nx\n  {% endif %}\ny", "", "").unwrap();
        assert_eq!(t.render(&[], false).unwrap(), "x\ny");
        let t = ChatTemplate::new("{{ strftime_now('%Y') }}", "", "").unwrap();
        let year: i64 = t.render(&[], false).unwrap().parse().unwrap();
        assert!(year >= 2024);
    }

    #[test]
    fn strftime_formats() {
        // 2024-07-26 13:05:09 UTC was a Friday.
        let t = 1_721_999_109;
        assert_eq!(strftime("%d %b %Y", t), "26 Jul 2024");
        assert_eq!(
            strftime("%A %B %-d, %H:%M:%S %p %I %y %%", t),
            "Friday July 26, 13:05:09 PM 01 24 %"
        );
        assert_eq!(strftime("%Q", 0), "%Q");
        assert_eq!(strftime("%Y-%m-%d %a", 0), "1970-01-01 Thu");
        assert_eq!(civil_from_days(-1), (1969, 12, 31));
        assert_eq!(civil_from_days(19_782), (2024, 2, 29));
    }

    #[test]
    fn shareable_across_threads() {
        // The engine shares one model's file, tokenizer and template between request threads.
        fn assert_send_sync<T: Send + Sync>() {}
        assert_send_sync::<Gguf>();
        assert_send_sync::<crate::tokenizer::Tokenizer>();
        assert_send_sync::<crate::tokenizer::StreamDecoder>();
        assert_send_sync::<ChatTemplate>();
    }

    #[test]
    fn python_split_semantics() {
        let split = |s, sep, max, right| py_split(s, sep, max, right).unwrap();
        assert_eq!(split("  a  b c ", None, None, false), ["a", "b", "c"]);
        assert_eq!(split("  a  b c ", None, None, true), ["a", "b", "c"]);
        assert_eq!(split("a,b,,c", Some(","), None, false), ["a", "b", "", "c"]);
        assert_eq!(split("a,b,c", Some(","), Some(1), false), ["a", "b,c"]);
        assert_eq!(split("a,b,c", Some(","), Some(1), true), ["a,b", "c"]);
        // Expected values from CPython.
        assert_eq!(split(" a  b c ", None, Some(1), false), ["a", "b c "]);
        assert_eq!(split(" a  b c ", None, Some(1), true), [" a  b", "c"]);
        assert_eq!(split(" a b ", None, Some(0), false), ["a b "]);
        assert_eq!(split("", Some(","), None, false), [""]);
        assert_eq!(split("   ", None, None, false), Vec::<String>::new());
        assert!(py_split("abc", Some(""), None, false).is_err());
    }
}
