//! The search space of `frugal tune`, read from TOML: the metric and its mode, the resource
//! and its rungs, the trial count or dollar budget, and one distribution per parameter.
//! A sampled configuration reaches the command as `{name}` placeholders in its arguments
//! and `FRUGAL_PARAM_<NAME>` variables.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::path::{Path, PathBuf};

use serde::de::{self, Deserializer, Visitor};
use serde::{Deserialize, Serialize, Serializer};

use super::asha::{AshaConfig, Mode, TrialId};

/// Ray Tune's ASHAScheduler default.
const DEFAULT_REDUCTION_FACTOR: u64 = 4;
/// Sampled floats keep this many significant digits, so the value a trial runs with is
/// exactly the short text it is given on its command line.
const SIGNIFICANT_DIGITS: usize = 6;

/// Why a search space was refused. Every message names the key at fault.
#[derive(Debug, thiserror::Error)]
pub enum SpaceError {
    #[error("cannot read the search space {}", path.display())]
    Read {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("search space: {0}")]
    Parse(#[source] toml::de::Error),
    #[error("search space: `{key}`: {reason}")]
    Invalid { key: String, reason: String },
}

fn invalid(key: impl Into<String>, reason: impl Into<String>) -> SpaceError {
    SpaceError::Invalid {
        key: key.into(),
        reason: reason.into(),
    }
}

/// A parameter's value: what a choice lists or a distribution samples.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    Int(i64),
    Float(f64),
    Str(String),
}

impl fmt::Display for Value {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Value::Int(i) => write!(f, "{i}"),
            // Display is the shortest text that reads back the same float: no `0.30000000000000004`.
            Value::Float(x) => write!(f, "{x}"),
            Value::Str(s) => f.write_str(s),
        }
    }
}

impl Serialize for Value {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Value::Int(i) => s.serialize_i64(*i),
            Value::Float(x) => s.serialize_f64(*x),
            Value::Str(v) => s.serialize_str(v),
        }
    }
}

impl<'de> Deserialize<'de> for Value {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ValueVisitor;
        impl Visitor<'_> for ValueVisitor {
            type Value = Value;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a number or a string")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Value, E> {
                Ok(Value::Int(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Value, E> {
                i64::try_from(v)
                    .map(Value::Int)
                    .map_err(|_| E::custom(format!("integer {v} is too large")))
            }
            fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
                Ok(Value::Float(v))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
                Ok(Value::Str(v.to_owned()))
            }
        }
        d.deserialize_any(ValueVisitor)
    }
}

/// One sampled configuration, by parameter name.
pub type Params = BTreeMap<String, Value>;

/// A parameter's distribution.
#[derive(Debug, Clone, PartialEq)]
pub enum Param {
    LogUniform {
        low: f64,
        high: f64,
    },
    Uniform {
        low: f64,
        high: f64,
    },
    /// Both bounds included.
    Int {
        low: i64,
        high: i64,
    },
    Choice(Vec<Value>),
}

/// How many trials the tuner may start.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Limit {
    Trials(u32),
    /// Trials start until their cost reaches this; the caller prices them.
    BudgetUsd(f64),
}

/// A validated search space.
#[derive(Debug, Clone, PartialEq)]
pub struct Space {
    /// The numeric field of the metrics lines that ranks trials.
    pub metric: String,
    pub mode: Mode,
    /// The metrics field that counts progress (`step`, `epoch`).
    pub resource: String,
    pub min_resource: u64,
    pub max_resource: u64,
    pub reduction_factor: u64,
    pub limit: Limit,
    pub params: BTreeMap<String, Param>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpace {
    metric: String,
    mode: Mode,
    resource: String,
    min_resource: u64,
    max_resource: u64,
    reduction_factor: Option<u64>,
    trials: Option<u32>,
    budget_usd: Option<Money>,
    space: BTreeMap<String, RawParam>,
}

#[derive(Deserialize)]
#[serde(rename_all = "lowercase", deny_unknown_fields)]
enum RawParam {
    Loguniform([f64; 2]),
    Uniform([f64; 2]),
    Int([i64; 2]),
    Choice(Vec<Value>),
}

/// Dollars as the issue writes them (`"2.50"`, a string that keeps cents exact) or a number.
#[derive(Deserialize)]
#[serde(untagged)]
enum Money {
    Text(String),
    Number(f64),
}

impl Space {
    /// Reads and validates the search space file at `path`.
    pub fn load(path: &Path) -> Result<Self, SpaceError> {
        let text = std::fs::read_to_string(path).map_err(|source| SpaceError::Read {
            path: path.to_owned(),
            source,
        })?;
        Self::from_toml(&text)
    }

    /// Parses and validates a search space.
    pub fn from_toml(text: &str) -> Result<Self, SpaceError> {
        let raw: RawSpace = toml::from_str(text).map_err(SpaceError::Parse)?;
        raw.validate()
    }

    /// The scheduler's settings; `budget_usd` leaves the trial count open.
    pub fn asha_config(&self) -> AshaConfig {
        AshaConfig {
            mode: self.mode,
            min_resource: self.min_resource,
            max_resource: self.max_resource,
            reduction_factor: self.reduction_factor,
            max_trials: match self.limit {
                Limit::Trials(n) => Some(n),
                Limit::BudgetUsd(_) => None,
            },
        }
    }

    /// Refuses a `{name}` in the command that names no parameter: a typo would otherwise
    /// reach the command as written. Braces around anything but a name are left alone.
    pub fn check_args(&self, args: &[String]) -> Result<(), SpaceError> {
        for arg in args {
            let mut rest = arg.as_str();
            while let Some(open) = rest.find('{') {
                rest = &rest[open + 1..];
                let Some(close) = rest.find('}') else { break };
                let name = &rest[..close];
                if is_name(name) && !self.params.contains_key(name) && !BUILTIN.contains(&name) {
                    return Err(invalid(
                        "space",
                        format!("the command's `{{{name}}}` names no parameter of the space"),
                    ));
                }
            }
        }
        Ok(())
    }

    /// The configuration of `trial`, a function of the seed and the trial alone, so a
    /// resumed tuner samples what the first one would have.
    pub fn sample(&self, seed: u64, trial: TrialId) -> Params {
        let mut rng = SplitMix64(mix64(seed ^ mix64(u64::from(trial))));
        self.params
            .iter()
            .map(|(name, param)| {
                let value = match param {
                    Param::LogUniform { low, high } => {
                        let x = (low.ln() + rng.unit() * (high.ln() - low.ln())).exp();
                        Value::Float(round_significant(x).clamp(*low, *high))
                    }
                    Param::Uniform { low, high } => {
                        let x = low + rng.unit() * (high - low);
                        Value::Float(round_significant(x).clamp(*low, *high))
                    }
                    Param::Int { low, high } => {
                        let span = (i128::from(*high) - i128::from(*low) + 1) as u128;
                        let offset = rng.below(span);
                        // In range by construction: low + offset <= high.
                        Value::Int((i128::from(*low) + offset as i128) as i64)
                    }
                    Param::Choice(values) => {
                        let i = rng.below(values.len() as u128) as usize;
                        values[i].clone()
                    }
                };
                (name.clone(), value)
            })
            .collect()
    }
}

impl RawSpace {
    fn validate(self) -> Result<Space, SpaceError> {
        for (key, value) in [("metric", &self.metric), ("resource", &self.resource)] {
            if value.trim().is_empty() {
                return Err(invalid(key, "must not be empty"));
            }
        }
        if self.min_resource == 0 {
            return Err(invalid("min_resource", "must be at least 1"));
        }
        if self.min_resource > self.max_resource {
            return Err(invalid(
                "min_resource",
                format!(
                    "{} is above max_resource {}",
                    self.min_resource, self.max_resource
                ),
            ));
        }
        let reduction_factor = self.reduction_factor.unwrap_or(DEFAULT_REDUCTION_FACTOR);
        if reduction_factor < 2 {
            return Err(invalid(
                "reduction_factor",
                format!("must be at least 2, got {reduction_factor}"),
            ));
        }
        let limit = match (self.trials, self.budget_usd) {
            (Some(0), None) => return Err(invalid("trials", "must be at least 1")),
            (Some(n), None) => Limit::Trials(n),
            (None, Some(money)) => Limit::BudgetUsd(money.dollars()?),
            (None, None) => return Err(invalid("trials", "set `trials` or `budget_usd`")),
            (Some(_), Some(_)) => {
                return Err(invalid(
                    "budget_usd",
                    "set `trials` or `budget_usd`, not both",
                ));
            }
        };
        if self.space.is_empty() {
            return Err(invalid("space", "needs at least one parameter"));
        }
        let mut env_names = BTreeSet::new();
        let mut params = BTreeMap::new();
        for (name, raw) in self.space {
            let key = format!("space.{name}");
            check_name(&key, &name)?;
            if !env_names.insert(env_name(&name)) {
                return Err(invalid(
                    key,
                    format!("{} is already another parameter's", env_name(&name)),
                ));
            }
            params.insert(name, raw.validate(&key)?);
        }
        Ok(Space {
            metric: self.metric,
            mode: self.mode,
            resource: self.resource,
            min_resource: self.min_resource,
            max_resource: self.max_resource,
            reduction_factor,
            limit,
            params,
        })
    }
}

impl Money {
    fn dollars(self) -> Result<f64, SpaceError> {
        let dollars = match self {
            Money::Text(text) => text.trim().trim_start_matches('$').parse().map_err(|_| {
                invalid(
                    "budget_usd",
                    format!("{text:?} is not an amount of dollars"),
                )
            })?,
            Money::Number(x) => x,
        };
        if !(dollars > 0.0 && f64::is_finite(dollars)) {
            return Err(invalid("budget_usd", "must be a positive amount"));
        }
        Ok(dollars)
    }
}

impl RawParam {
    fn validate(self, key: &str) -> Result<Param, SpaceError> {
        let float_range = |kind: &str, [low, high]: [f64; 2]| {
            if !(low.is_finite() && high.is_finite()) {
                return Err(invalid(key, format!("{kind} bounds must be finite")));
            }
            if low >= high {
                return Err(invalid(
                    key,
                    format!("{kind} range [{low}, {high}] is empty or reversed"),
                ));
            }
            Ok((low, high))
        };
        match self {
            RawParam::Loguniform(range) => {
                let (low, high) = float_range("loguniform", range)?;
                if low <= 0.0 {
                    return Err(invalid(
                        key,
                        format!("loguniform bounds must be positive, got [{low}, {high}]"),
                    ));
                }
                Ok(Param::LogUniform { low, high })
            }
            RawParam::Uniform(range) => {
                let (low, high) = float_range("uniform", range)?;
                Ok(Param::Uniform { low, high })
            }
            RawParam::Int([low, high]) => {
                if low > high {
                    return Err(invalid(
                        key,
                        format!("int range [{low}, {high}] is reversed"),
                    ));
                }
                Ok(Param::Int { low, high })
            }
            RawParam::Choice(values) => {
                if values.is_empty() {
                    return Err(invalid(key, "choice needs at least one value"));
                }
                if let Some(x) = values.iter().find_map(|v| match v {
                    Value::Float(x) if !x.is_finite() => Some(x),
                    _ => None,
                }) {
                    return Err(invalid(key, format!("choice value {x} is not finite")));
                }
                Ok(Param::Choice(values))
            }
        }
    }
}

/// Placeholders the tuner fills itself: the trial's number and its directory.
pub const BUILTIN: [&str; 2] = ["trial", "trial_dir"];

/// A name must make a `{name}` placeholder and an environment variable.
fn check_name(key: &str, name: &str) -> Result<(), SpaceError> {
    if BUILTIN.contains(&name) {
        Err(invalid(
            key,
            format!("`{{{name}}}` is the tuner's own placeholder: name the parameter otherwise"),
        ))
    } else if is_name(name) {
        Ok(())
    } else {
        Err(invalid(
            key,
            "a parameter name is letters, digits and `_`, not starting with a digit",
        ))
    }
}

fn is_name(name: &str) -> bool {
    let mut chars = name.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
}

fn env_name(name: &str) -> String {
    format!("FRUGAL_PARAM_{}", name.to_ascii_uppercase())
}

/// The `FRUGAL_PARAM_<NAME>` variables of a configuration.
pub fn param_env(params: &Params) -> Vec<(String, String)> {
    params
        .iter()
        .map(|(name, value)| (env_name(name), value.to_string()))
        .collect()
}

/// The command's arguments with each `{name}` of a parameter replaced by its value, in one
/// pass so a value is never itself expanded; other braces are left as written.
pub fn render_args(args: &[String], params: &Params) -> Vec<String> {
    args.iter().map(|arg| render_arg(arg, params)).collect()
}

fn render_arg(arg: &str, params: &Params) -> String {
    let mut out = String::with_capacity(arg.len());
    let mut rest = arg;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        match after
            .find('}')
            .and_then(|close| Some((close, params.get(&after[..close])?)))
        {
            Some((close, value)) => {
                out.push_str(&value.to_string());
                rest = &after[close + 1..];
            }
            None => {
                out.push('{');
                rest = after;
            }
        }
    }
    out.push_str(rest);
    out
}

fn round_significant(x: f64) -> f64 {
    format!("{x:.prec$e}", prec = SIGNIFICANT_DIGITS - 1)
        .parse()
        .unwrap_or(x)
}

/// splitmix64 (Steele et al. 2014): a few lines of our own, so a seed samples the same
/// configurations whatever version of a random crate is built in.
struct SplitMix64(u64);

impl SplitMix64 {
    fn next_u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        mix64(self.0)
    }

    /// Uniform in [0, 1), 53 bits.
    fn unit(&mut self) -> f64 {
        (self.next_u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }

    /// Uniform in [0, n) for 0 < n <= 2^64, by multiply-shift (bias below 2^-64 · n).
    fn below(&mut self, n: u128) -> u128 {
        (u128::from(self.next_u64()) * n) >> 64
    }
}

fn mix64(mut z: u64) -> u64 {
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
    z ^ (z >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    const ISSUE_SPACE: &str = r#"
metric = "eval_loss"
mode = "min"
resource = "step"
min_resource = 100
max_resource = 1600
reduction_factor = 4
trials = 16
[space]
lr = { loguniform = [1e-4, 3e-2] }
hidden = { choice = [32, 64, 128] }
batch = { int = [8, 128] }
dropout = { uniform = [0.0, 0.3] }
"#;

    fn parse(text: &str) -> Result<Space, SpaceError> {
        Space::from_toml(text)
    }

    /// The issue's space with `from` replaced by `to`, for one bad input at a time.
    fn error_with(from: &str, to: &str) -> String {
        assert!(ISSUE_SPACE.contains(from), "{from}");
        match parse(&ISSUE_SPACE.replace(from, to)) {
            Ok(space) => format!("accepted: {space:?}"),
            Err(e) => e.to_string(),
        }
    }

    #[test]
    fn parses_the_space_the_issue_shows() {
        let space = parse(ISSUE_SPACE).unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(space.metric, "eval_loss");
        assert_eq!(space.mode, Mode::Min);
        assert_eq!(space.limit, Limit::Trials(16));
        assert_eq!(
            space.params["lr"],
            Param::LogUniform {
                low: 1e-4,
                high: 3e-2
            }
        );
        assert_eq!(
            space.params["hidden"],
            Param::Choice(vec![Value::Int(32), Value::Int(64), Value::Int(128)])
        );
        assert_eq!(space.params["batch"], Param::Int { low: 8, high: 128 });
        assert_eq!(space.asha_config().rungs(), [100, 400, 1600]);
    }

    #[test]
    fn reduction_factor_defaults_to_4_and_budget_reads_dollars() {
        let text = ISSUE_SPACE
            .replace("reduction_factor = 4\n", "")
            .replace("trials = 16", "budget_usd = \"2.50\"");
        let space = parse(&text).unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(space.reduction_factor, 4);
        assert_eq!(space.limit, Limit::BudgetUsd(2.5));
        assert_eq!(space.asha_config().max_trials, None);
    }

    #[test]
    fn bad_input_is_refused_naming_the_key() {
        let cases = [
            (
                "trials = 16",
                "trials = 16\nseed = 3",
                "unknown field `seed`",
            ),
            (
                "batch = { int = [8, 128] }",
                "batch = { int = [8, 128], step = 2 }",
                "step",
            ),
            (
                "{ uniform = [0.0, 0.3] }",
                "{ normal = [0.0, 0.3] }",
                "unknown variant `normal`",
            ),
            (
                "{ uniform = [0.0, 0.3] }",
                "{ uniform = [0.3, 0.3] }",
                "`space.dropout`: uniform range [0.3, 0.3] is empty or reversed",
            ),
            (
                "{ int = [8, 128] }",
                "{ int = [128, 8] }",
                "`space.batch`: int range [128, 8] is reversed",
            ),
            (
                "[1e-4, 3e-2]",
                "[0.0, 3e-2]",
                "`space.lr`: loguniform bounds must be positive",
            ),
            (
                "[32, 64, 128]",
                "[]",
                "`space.hidden`: choice needs at least one value",
            ),
            (
                "min_resource = 100",
                "min_resource = 2000",
                "`min_resource`: 2000 is above max_resource 1600",
            ),
            (
                "reduction_factor = 4",
                "reduction_factor = 1",
                "`reduction_factor`: must be at least 2",
            ),
            ("trials = 16", "", "set `trials` or `budget_usd`"),
            ("trials = 16", "trials = 16\nbudget_usd = \"1\"", "not both"),
            ("trials = 16", "budget_usd = \"lots\"", "`budget_usd`"),
            (
                "mode = \"min\"",
                "mode = \"lowest\"",
                "unknown variant `lowest`",
            ),
            ("[32, 64, 128]", "[32, true]", "a number or a string"),
            ("batch = {", "batch-size = {", "`space.batch-size`"),
        ];
        for (from, to, wanted) in cases {
            let error = error_with(from, to);
            assert!(error.contains(wanted), "{to}: {error}");
        }
    }

    #[test]
    fn sampling_is_seeded_per_trial_and_stays_in_range() {
        let space = parse(ISSUE_SPACE).unwrap_or_else(|e| unreachable!("{e}"));
        assert_eq!(space.sample(7, 3), space.sample(7, 3));
        assert_ne!(space.sample(7, 3), space.sample(7, 4));
        assert_ne!(space.sample(7, 3), space.sample(8, 3));
        let mut hidden = BTreeSet::new();
        for trial in 0..200 {
            let p = space.sample(1, trial);
            let Value::Float(lr) = p["lr"] else {
                unreachable!("{p:?}")
            };
            assert!((1e-4..=3e-2).contains(&lr), "{lr}");
            let Value::Int(batch) = p["batch"] else {
                unreachable!("{p:?}")
            };
            assert!((8..=128).contains(&batch), "{batch}");
            hidden.insert(p["hidden"].to_string());
        }
        assert_eq!(hidden.len(), 3);
    }

    #[test]
    fn renders_placeholders_and_environment_without_trailing_noise() {
        let params: Params = [
            ("lr".to_owned(), Value::Float(0.001)),
            ("hidden".to_owned(), Value::Int(64)),
            ("dropout".to_owned(), Value::Float(0.1 + 0.2)),
            ("opt".to_owned(), Value::Str("{lr}".to_owned())),
        ]
        .into_iter()
        .collect();
        let args: Vec<String> = ["train.py", "--lr", "{lr}", "--h={hidden}", "{opt}", "{x} {"]
            .map(String::from)
            .to_vec();
        assert_eq!(
            render_args(&args, &params),
            ["train.py", "--lr", "0.001", "--h=64", "{lr}", "{x} {"]
        );
        assert_eq!(
            param_env(&params),
            [
                (
                    "FRUGAL_PARAM_DROPOUT".to_owned(),
                    "0.30000000000000004".to_owned()
                ),
                ("FRUGAL_PARAM_HIDDEN".to_owned(), "64".to_owned()),
                ("FRUGAL_PARAM_LR".to_owned(), "0.001".to_owned()),
                ("FRUGAL_PARAM_OPT".to_owned(), "{lr}".to_owned()),
            ]
        );
        // Sampled floats are rounded, so what the command is given is short.
        let space = parse(ISSUE_SPACE).unwrap_or_else(|e| unreachable!("{e}"));
        for trial in 0..50 {
            for (_, value) in param_env(&space.sample(0, trial)) {
                assert!(value.len() <= 12, "{value}");
            }
        }
    }

    #[test]
    fn names_that_collide_as_variables_are_refused() {
        let error = error_with("[space]\n", "[space]\nLR = { uniform = [0.0, 1.0] }\n");
        assert!(error.contains("FRUGAL_PARAM_LR"), "{error}");
    }

    #[test]
    fn a_placeholder_that_names_no_parameter_is_refused() {
        let space = parse(ISSUE_SPACE).unwrap_or_else(|e| unreachable!("{e}"));
        let args = |a: &[&str]| a.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert!(
            space
                .check_args(&args(&["--lr", "{lr}", "{\"a\": 1}", "{}"]))
                .is_ok()
        );
        let error = space
            .check_args(&args(&["--lr", "{lrate}"]))
            .err()
            .map(|e| e.to_string())
            .unwrap_or_default();
        assert!(
            error.contains("`{lrate}` names no parameter of the space"),
            "{error}"
        );
        // The tuner's own placeholders pass, and no parameter may take their names.
        assert!(
            space
                .check_args(&args(&["--out", "{trial_dir}/m.bin", "--seed", "{trial}"]))
                .is_ok()
        );
        let error = error_with(
            "[space]\n",
            "[space]\ntrial_dir = { uniform = [0.0, 1.0] }\n",
        );
        assert!(error.contains("the tuner's own placeholder"), "{error}");
    }
}
