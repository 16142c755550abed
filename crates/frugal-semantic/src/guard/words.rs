//! One question as the guard reads it: words sorted into the classes whose difference
//! changes an answer (numbers, units, code, negation, modality, degree) and the content
//! words left to align, each reduced to its WordNet lemma.

use crate::lexicon::Lexicon;

/// Deontic force of a modal: what a rule allows is not what it demands.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Modal {
    Must,
    Should,
    May,
}

/// A content word: its lemma (the key it aligns on) and what else the guard needs of it.
#[derive(Debug, Clone, PartialEq)]
pub(crate) struct Content {
    /// As written, lower case.
    pub word: String,
    /// WordNet's first base form, or the word itself when WordNet does not know it.
    pub lemma: String,
    /// Capitalized inside the sentence, or unknown to WordNet: a name.
    pub name: bool,
    /// Capitalized inside the sentence.
    pub cap: bool,
    /// Its place among the words of the text (for order).
    pub at: usize,
    /// The last relation word between it and the content word before it ("to", "from",
    /// "than"...): its role.
    pub role: Option<&'static str>,
}

/// The lexical view of one text.
#[derive(Debug, Default, PartialEq)]
pub(crate) struct Words {
    /// Cardinals as digits ("five" and "5" are both "5"), ordinals as "#3", sorted.
    pub numbers: Vec<String>,
    /// Units and currencies, canonical ("km", "usd", "percent"), sorted.
    pub units: Vec<&'static str>,
    /// Identifiers, flags and operators, as written, sorted.
    pub code: Vec<String>,
    /// The numbers in the order written, then the identifiers in theirs ("is 7 more than
    /// 5", "cast int64 to int32"): the same ones in another order swap the question.
    pub order: Vec<String>,
    pub negations: usize,
    /// Deontic modals present, sorted and deduplicated.
    pub modals: Vec<Modal>,
    /// Quantifiers and intensifiers ("all", "some", "slightly"), sorted.
    pub degree: Vec<&'static str>,
    pub content: Vec<Content>,
    /// Every word in order, lower case (coordination and roles are read from it).
    pub all: Vec<String>,
}

const NEGATIONS: &[&str] = &[
    "not", "no", "never", "none", "nobody", "nothing", "neither", "nor", "without", "cannot",
    "nowhere",
];

/// Words that relate the content words around them; the one before a word is its role.
pub(crate) const RELATIONS: &[&str] = &[
    "to", "into", "than", "from", "over", "on", "onto", "by", "before", "after", "against",
    "towards", "toward", "under", "above", "below", "beyond", "via", "for", "with", "within", "of",
    "in", "at", "per",
];

/// Words that join two content words without ordering them ("A or B" = "B or A").
pub(crate) const COORDINATORS: &[&str] = &["and", "or", "vs", "versus", "&", "plus", "between"];

const FUNCTION: &[&str] = &[
    "a",
    "an",
    "the",
    "is",
    "are",
    "was",
    "were",
    "be",
    "been",
    "being",
    "am",
    "do",
    "does",
    "did",
    "done",
    "i",
    "me",
    "my",
    "mine",
    "myself",
    "you",
    "your",
    "yours",
    "we",
    "us",
    "our",
    "it",
    "its",
    "they",
    "them",
    "their",
    "he",
    "him",
    "his",
    "she",
    "her",
    "as",
    "that",
    "this",
    "these",
    "those",
    "there",
    "here",
    "will",
    "would",
    "shall",
    "what",
    "why",
    "how",
    "when",
    "where",
    "who",
    "whom",
    "whose",
    "which",
    "if",
    "so",
    "about",
    "get",
    "got",
    "getting",
    "s",
    "just",
    "also",
    "then",
    "than",
    "and",
    "or",
    "vs",
    "versus",
    "between",
    "whether",
    "has",
    "have",
    "had",
    "having",
    "can",
    "could",
    "able",
    "need",
    "needs",
    "want",
    "wants",
    "'s",
    "like",
    "such",
    "up",
    "out",
    "off",
    "down",
    "any",
    "anything",
    "something",
    "thing",
    "things",
    "way",
    "ways",
    "kind",
    "sort",
    "type",
    "use",
    "using",
    "make",
    "go",
    "going",
    "really",
    "actually",
    "exactly",
    "basically",
    "please",
    "kindly",
    "tell",
    "explain",
    "know",
    "wonder",
    "wondering",
    "curious",
    "question",
    "quick",
    "hey",
    "hi",
    "hello",
    "thanks",
    "thank",
    "help",
    "someone",
    "anyone",
    "possible",
    "to",
    "into",
    "from",
    "over",
    "on",
    "onto",
    "by",
    "for",
    "with",
    "within",
    "of",
    "in",
    "at",
    "per",
    "via",
    "via",
    "whats",
    "etc",
    "ok",
    "okay",
    "idea",
    "ideas",
    "anybody",
    "somebody",
    "guys",
    "folks",
];

/// Words of quantity or intensity: a different one asks a different question.
const DEGREE: &[&str] = &[
    "all",
    "some",
    "most",
    "least",
    "many",
    "few",
    "fewer",
    "every",
    "each",
    "always",
    "sometimes",
    "often",
    "usually",
    "rarely",
    "seldom",
    "occasionally",
    "frequently",
    "slightly",
    "very",
    "extremely",
    "highly",
    "somewhat",
    "little",
    "lot",
    "lots",
    "much",
    "more",
    "less",
    "mild",
    "mildly",
    "severe",
    "severely",
    "moderate",
    "moderately",
    "barely",
    "fully",
    "partially",
    "partly",
    "completely",
    "totally",
    "mostly",
    "hardly",
    "too",
    "enough",
    "only",
    "almost",
    "nearly",
    "several",
    "both",
    "either",
    "entire",
    "whole",
];

const MUST: &[&str] = &[
    "must",
    "required",
    "require",
    "mandatory",
    "obligatory",
    "compulsory",
    "obliged",
];
const SHOULD: &[&str] = &["should", "ought", "advisable", "recommended"];
const MAY: &[&str] = &["may", "allowed", "permitted", "permissible"];

/// Units and currencies by their spellings, each to one canonical name.
const UNITS: &[(&str, &[&str])] = &[
    ("percent", &["%", "percent", "percentage", "pct"]),
    (
        "km",
        &[
            "km",
            "kms",
            "kilometer",
            "kilometers",
            "kilometre",
            "kilometres",
        ],
    ),
    ("m", &["m", "meter", "meters", "metre", "metres"]),
    (
        "cm",
        &[
            "cm",
            "centimeter",
            "centimeters",
            "centimetre",
            "centimetres",
        ],
    ),
    (
        "mm",
        &[
            "mm",
            "millimeter",
            "millimeters",
            "millimetre",
            "millimetres",
        ],
    ),
    ("mile", &["mi", "mile", "miles"]),
    ("ft", &["ft", "foot", "feet"]),
    ("in", &["inch", "inches"]),
    ("yd", &["yd", "yard", "yards"]),
    (
        "kg",
        &["kg", "kgs", "kilogram", "kilograms", "kilo", "kilos"],
    ),
    ("g", &["g", "gram", "grams", "gramme", "grammes"]),
    ("mg", &["mg", "milligram", "milligrams"]),
    ("lb", &["lb", "lbs", "pound", "pounds"]),
    ("oz", &["oz", "ounce", "ounces"]),
    ("l", &["l", "liter", "liters", "litre", "litres"]),
    (
        "ml",
        &[
            "ml",
            "milliliter",
            "milliliters",
            "millilitre",
            "millilitres",
        ],
    ),
    ("gal", &["gal", "gallon", "gallons"]),
    ("cup", &["cup", "cups"]),
    ("tbsp", &["tbsp", "tablespoon", "tablespoons"]),
    ("tsp", &["tsp", "teaspoon", "teaspoons"]),
    ("c", &["°c", "celsius", "centigrade"]),
    ("f", &["°f", "fahrenheit"]),
    ("k", &["kelvin"]),
    ("s", &["sec", "secs", "second", "seconds"]),
    ("min", &["min", "mins", "minute", "minutes"]),
    ("h", &["hr", "hrs", "hour", "hours"]),
    ("day", &["day", "days"]),
    ("week", &["week", "weeks", "wk", "wks"]),
    ("month", &["month", "months"]),
    ("year", &["yr", "yrs", "year", "years"]),
    ("b", &["byte", "bytes"]),
    ("kb", &["kb", "kilobyte", "kilobytes"]),
    ("mb", &["mb", "megabyte", "megabytes"]),
    ("gb", &["gb", "gigabyte", "gigabytes"]),
    ("tb", &["tb", "terabyte", "terabytes"]),
    ("mbps", &["mbps"]),
    ("gbps", &["gbps"]),
    ("ghz", &["ghz", "gigahertz"]),
    ("mhz", &["mhz", "megahertz"]),
    ("w", &["w", "watt", "watts"]),
    ("kw", &["kw", "kilowatt", "kilowatts"]),
    ("kwh", &["kwh"]),
    ("v", &["v", "volt", "volts"]),
    ("mph", &["mph"]),
    ("kph", &["kph", "km/h", "kmh"]),
    ("cal", &["cal", "calorie", "calories", "kcal"]),
    ("usd", &["$", "usd", "dollar", "dollars", "buck", "bucks"]),
    ("eur", &["€", "eur", "euro", "euros"]),
    ("gbp", &["£", "gbp", "sterling"]),
    ("jpy", &["¥", "jpy", "yen"]),
    ("inr", &["₹", "inr", "rupee", "rupees", "rs"]),
    ("cny", &["cny", "yuan", "rmb"]),
    ("cad", &["cad"]),
    ("aud", &["aud"]),
    ("chf", &["chf", "franc", "francs"]),
    ("btc", &["btc", "bitcoin", "bitcoins"]),
];

/// Cardinals spelled out ("one" only where it counts something: see [`counts`]).
const CARDINALS: &[(&str, u64)] = &[
    ("zero", 0),
    ("one", 1),
    ("two", 2),
    ("three", 3),
    ("four", 4),
    ("five", 5),
    ("six", 6),
    ("seven", 7),
    ("eight", 8),
    ("nine", 9),
    ("ten", 10),
    ("eleven", 11),
    ("twelve", 12),
    ("thirteen", 13),
    ("fourteen", 14),
    ("fifteen", 15),
    ("sixteen", 16),
    ("seventeen", 17),
    ("eighteen", 18),
    ("nineteen", 19),
    ("twenty", 20),
    ("thirty", 30),
    ("forty", 40),
    ("fifty", 50),
    ("sixty", 60),
    ("seventy", 70),
    ("eighty", 80),
    ("ninety", 90),
    ("dozen", 12),
    ("hundred", 100),
    ("thousand", 1_000),
    ("million", 1_000_000),
    ("billion", 1_000_000_000),
];

const ORDINALS: &[(&str, u64)] = &[
    ("first", 1),
    ("second", 2),
    ("third", 3),
    ("fourth", 4),
    ("fifth", 5),
    ("sixth", 6),
    ("seventh", 7),
    ("eighth", 8),
    ("ninth", 9),
    ("tenth", 10),
    ("eleventh", 11),
    ("twelfth", 12),
    ("thirteenth", 13),
    ("twentieth", 20),
    ("hundredth", 100),
    ("last", u64::MAX),
];

/// Contractions spelled out, so "What's" reads as "what is" and "don't" as "do not".
const CONTRACTIONS: &[(&str, &[&str])] = &[
    ("can't", &["can", "not"]),
    ("cannot", &["can", "not"]),
    ("won't", &["will", "not"]),
    ("shan't", &["shall", "not"]),
    ("ain't", &["is", "not"]),
    ("let's", &["let", "us"]),
    ("i'm", &["i", "am"]),
    // Typed without the apostrophe.
    ("dont", &["do", "not"]),
    ("doesnt", &["does", "not"]),
    ("didnt", &["did", "not"]),
    ("cant", &["can", "not"]),
    ("wont", &["will", "not"]),
    ("isnt", &["is", "not"]),
    ("arent", &["are", "not"]),
    ("wasnt", &["was", "not"]),
    ("werent", &["were", "not"]),
    ("havent", &["have", "not"]),
    ("hasnt", &["has", "not"]),
    ("shouldnt", &["should", "not"]),
    ("wouldnt", &["would", "not"]),
    ("couldnt", &["could", "not"]),
    ("mustnt", &["must", "not"]),
];

/// Splits off what a word's apostrophe stands for: "don't" -> "do" + "not".
fn contraction(word: &str) -> Option<Vec<&str>> {
    if let Some((_, parts)) = CONTRACTIONS.iter().find(|(w, _)| *w == word) {
        return Some(parts.to_vec());
    }
    for (suffix, full) in [
        ("n't", "not"),
        ("'re", "are"),
        ("'ve", "have"),
        ("'ll", "will"),
        ("'d", "would"),
        ("'s", "'s"),
        ("'m", "am"),
    ] {
        if let Some(base) = word.strip_suffix(suffix)
            && !base.is_empty()
        {
            return Some(vec![base, full]);
        }
    }
    None
}

/// Identifiers, flags, calls and operators: compared as written.
fn is_code(raw: &str) -> bool {
    let inner = raw.trim_matches(|c: char| matches!(c, '?' | '!' | ',' | ';' | '"' | '`'));
    if raw.contains('`') && inner.chars().any(char::is_alphanumeric) {
        return true;
    }
    let letters = inner.chars().filter(|c| c.is_alphabetic()).count();
    let operator = !inner.is_empty()
        && inner.len() >= 2
        && inner.chars().all(|c| "=!<>&|+-*/%^~:.".contains(c));
    // "useEffect", "getElementById"; not brands such as "iPhone", "eBay" or "WiFi".
    let lower_prefix = inner.chars().take_while(|c| c.is_lowercase()).count();
    let camel = lower_prefix >= 2
        && inner
            .chars()
            .nth(lower_prefix)
            .is_some_and(char::is_uppercase);
    let dotted = inner.split('.').filter(|p| !p.is_empty()).count() >= 2
        && letters > 0
        && !inner.ends_with('.')
        && inner
            .split('.')
            .all(|p| p.chars().all(|c| c.is_alphanumeric() || c == '_'))
        && inner.split('.').any(|p| p.chars().any(char::is_alphabetic));
    operator
        || camel
        || dotted
        || (letters > 0
            && (inner.contains('_')
                || inner.contains("::")
                || inner.contains("()")
                || inner.starts_with("--")
                || (inner.starts_with('-') && inner.len() == 2)
                || inner.contains('#')
                || inner.contains('/') && !inner.contains("km/h")))
}

fn cardinal(w: &str) -> Option<u64> {
    CARDINALS.iter().find(|(n, _)| *n == w).map(|&(_, v)| v)
}

fn ordinal(w: &str) -> Option<u64> {
    if let Some(&(_, v)) = ORDINALS.iter().find(|(n, _)| *n == w) {
        return Some(v);
    }
    let digits = w.trim_end_matches(|c: char| c.is_alphabetic());
    let suffix = &w[digits.len()..];
    (matches!(suffix, "st" | "nd" | "rd" | "th") && !digits.is_empty())
        .then(|| digits.parse().ok())
        .flatten()
}

pub(crate) fn unit(w: &str) -> Option<&'static str> {
    UNITS
        .iter()
        .find(|(_, spellings)| spellings.contains(&w))
        .map(|&(canonical, _)| canonical)
}

fn pick(list: &[&'static str], w: &str) -> Option<&'static str> {
    list.iter().copied().find(|x| *x == w)
}

impl Words {
    pub fn of(text: &str, lex: &Lexicon) -> Words {
        let mut w = Words::default();
        let mut pieces: Vec<(String, bool)> = Vec::new();
        for (i, raw) in text.split_whitespace().enumerate() {
            if is_code(raw) {
                let code =
                    raw.trim_matches(|c: char| matches!(c, '?' | '!' | ',' | ';' | '"' | '`'));
                w.code.push(code.trim_end_matches('.').to_string());
                pieces.push(("<code>".into(), false));
                continue;
            }
            split_word(raw, i == 0, &mut pieces);
        }
        // "two-year-old" reads as "two year old", as "2-year-old" does; other compounds
        // are split unless WordNet knows them ("well-done").
        let pieces: Vec<(String, bool)> = pieces
            .into_iter()
            .flat_map(|(p, cap)| {
                let numeric = p
                    .split('-')
                    .any(|s| cardinal(s).is_some() || s.chars().all(|c| c.is_ascii_digit()));
                if p.contains('-') && (numeric || !lex.knows(&p)) {
                    p.split('-')
                        .filter(|s| !s.is_empty())
                        .map(|s| (s.to_string(), cap))
                        .collect()
                } else {
                    vec![(p, cap)]
                }
            })
            .collect();
        let mut number_before = false;
        // The last relation word since the previous content word: the next one's role.
        let mut relation: Option<&'static str> = None;
        let mut pending: Option<u64> = None;
        let flush = |pending: &mut Option<u64>, numbers: &mut Vec<String>| {
            if let Some(n) = pending.take() {
                numbers.push(n.to_string());
            }
        };
        let mut k = 0;
        while k < pieces.len() {
            let (word, cap) = (pieces[k].0.clone(), pieces[k].1);
            k += 1;
            if word == "<code>" {
                w.all.push(word);
                continue;
            }
            if word == "one" && !counts(w.all.last(), pieces.get(k).map(|p| p.0.as_str())) {
                w.all.push(word);
                continue;
            }
            // Numbers: digits, number words ("twenty five" = 25, "two thousand"), ordinals.
            if let Some(n) = cardinal(&word).or_else(|| plain_number(&word)) {
                let n_is_scale = matches!(n, 100 | 1_000 | 1_000_000 | 1_000_000_000);
                pending = Some(match pending {
                    Some(p) if n_is_scale => p.max(1).saturating_mul(n),
                    Some(p) if p >= 20 && p % 10 == 0 && n < 10 && cardinal(&word).is_some() => {
                        p + n
                    }
                    Some(p) => {
                        w.numbers.push(p.to_string());
                        n
                    }
                    None => n,
                });
                number_before = true;
                w.all.push("<n>".into());
                continue;
            }
            if let Some(x) = decimal(&word) {
                flush(&mut pending, &mut w.numbers);
                w.numbers.push(x);
                number_before = true;
                w.all.push("<n>".into());
                continue;
            }
            flush(&mut pending, &mut w.numbers);
            if let Some(n) = ordinal(&word)
                // "5 second(s)" is a duration, not the second of something.
                && !(number_before && word == "second")
            {
                w.numbers.push(if n == u64::MAX {
                    "#last".into()
                } else {
                    format!("#{n}")
                });
                number_before = false;
                w.all.push("<n>".into());
                continue;
            }
            let after_number = std::mem::take(&mut number_before);
            // A unit measures a number ("5 km", "$5", "10%"); alone it is a content word
            // ("convert dollars to rupees", "what time of year").
            let symbol = word.chars().all(|c| !c.is_alphanumeric());
            if let Some(u) = unit(&word)
                && (after_number || symbol)
            {
                // A unit is also a content word: "dollars to rupees" has an order.
                w.units.push(u);
                w.content.push(Content {
                    word: u.to_string(),
                    lemma: u.to_string(),
                    name: false,
                    cap: false,
                    at: w.all.len(),
                    role: relation.take(),
                });
                w.all.push(word);
                continue;
            }
            if NEGATIONS.contains(&word.as_str()) {
                w.negations += 1;
                if word == "cannot" {
                    w.all.push("can".into());
                }
                w.all.push(word);
                continue;
            }
            if let Some(m) = modal(&word, &w.all) {
                w.modals.push(m);
                w.all.push(word);
                continue;
            }
            // "How many", "how much": the question's frame, not a quantity.
            let after_how = w.all.last().is_some_and(|p| p == "how");
            if after_how && matches!(word.as_str(), "many" | "much") {
                w.all.push(word);
                continue;
            }
            if let Some(d) = pick(DEGREE, &word) {
                w.degree.push(d);
                w.all.push(word);
                continue;
            }
            if let Some(r) = RELATIONS.iter().copied().find(|r| *r == word) {
                relation = Some(r);
            }
            if FUNCTION.contains(&word.as_str()) || word.chars().all(|c| !c.is_alphanumeric()) {
                w.all.push(word);
                continue;
            }
            let lemma = lex.lemmas(&word).into_iter().next();
            let known = lemma.is_some();
            w.content.push(Content {
                lemma: lemma.unwrap_or_else(|| word.clone()),
                word: word.clone(),
                name: cap || !known,
                cap,
                at: w.all.len(),
                role: relation.take(),
            });
            w.all.push(word);
        }
        flush(&mut pending, &mut w.numbers);
        w.order = w.numbers.iter().chain(&w.code).cloned().collect();
        w.numbers.sort();
        w.units.sort_unstable();
        w.code.sort();
        w.modals.sort();
        w.modals.dedup();
        w.degree.sort_unstable();
        w
    }
}

/// Whether "one" between these words is a number ("one mile", "one liter") rather than a
/// pronoun ("which one", "quick one:", "one of them").
fn counts(before: Option<&String>, after: Option<&str>) -> bool {
    let pronoun = before.is_some_and(|b| {
        matches!(
            b.as_str(),
            "which"
                | "this"
                | "that"
                | "the"
                | "each"
                | "every"
                | "any"
                | "some"
                | "no"
                | "quick"
                | "only"
                | "another"
                | "a"
        )
    });
    let counted = after.is_some_and(|a| {
        a.chars().all(char::is_alphabetic) && !matches!(a, "of" | "another" | "or" | "and")
    });
    !pronoun && counted
}

fn modal(word: &str, before: &[String]) -> Option<Modal> {
    if MUST.contains(&word) {
        return Some(Modal::Must);
    }
    // "have to", "has to", "need to": obligation; "allowed to": permission.
    if word == "to"
        && let Some(p) = before.last()
        && matches!(p.as_str(), "have" | "has" | "had" | "need" | "needs")
    {
        return Some(Modal::Must);
    }
    if SHOULD.contains(&word) {
        return Some(Modal::Should);
    }
    MAY.contains(&word).then_some(Modal::May)
}

/// Digits with an optional thousands separator: "5,000" = 5000.
fn plain_number(w: &str) -> Option<u64> {
    let digits = w.replace(',', "");
    (!digits.is_empty() && digits.chars().all(|c| c.is_ascii_digit()))
        .then(|| digits.parse().ok())
        .flatten()
}

/// A decimal ("3.5", "0.25"), kept as written without trailing zeros.
fn decimal(w: &str) -> Option<String> {
    let (a, b) = w.split_once('.')?;
    (!a.is_empty()
        && !b.is_empty()
        && a.chars().all(|c| c.is_ascii_digit())
        && b.chars().all(|c| c.is_ascii_digit()))
    .then(|| {
        let b = b.trim_end_matches('0');
        if b.is_empty() {
            a.to_string()
        } else {
            format!("{a}.{b}")
        }
    })
}

/// Lower-cased pieces of one whitespace-separated word, with whether it was capitalized
/// inside the sentence: "$5,000" -> "$", "5,000"; "10km" -> "10", "km"; "don't" -> "do", "not".
fn split_word(raw: &str, first: bool, out: &mut Vec<(String, bool)>) {
    let mut cur = String::new();
    let mut pieces: Vec<String> = Vec::new();
    let mut chars = raw.chars().peekable();
    while let Some(c) = chars.next() {
        let in_number = cur.chars().last().is_some_and(|p| p.is_ascii_digit());
        let joins = c.is_alphanumeric()
            || c == '\''
            || c == '\u{2019}'
            || (matches!(c, '.' | ',')
                && in_number
                && chars.peek().is_some_and(char::is_ascii_digit))
            || (c == '-' && !cur.is_empty() && chars.peek().is_some_and(|n| n.is_alphabetic()));
        if joins {
            cur.push(if c == '\u{2019}' { '\'' } else { c });
            continue;
        }
        if !cur.is_empty() {
            pieces.push(std::mem::take(&mut cur));
        }
        if matches!(
            c,
            '$' | '\u{20ac}' | '\u{a3}' | '\u{a5}' | '\u{20b9}' | '%' | '&'
        ) {
            pieces.push(c.to_string());
        }
        // Clause breaks: a phrase set off by one may move ("For a sore throat, what ...").
        if matches!(c, ',' | ':' | ';') {
            pieces.push(",".into());
        }
        if c == '\u{b0}'
            && let Some(&n) = chars.peek()
            && matches!(n, 'C' | 'F' | 'c' | 'f')
        {
            chars.next();
            pieces.push(format!("\u{b0}{}", n.to_ascii_lowercase()));
        }
    }
    if !cur.is_empty() {
        pieces.push(cur);
    }
    for (i, p) in pieces.into_iter().enumerate() {
        let p = p.trim_matches('\'').to_string();
        if p.is_empty() {
            continue;
        }
        let cap =
            !(first && i == 0) && p.chars().next().is_some_and(char::is_uppercase) && p != "I";
        let lower = p.to_lowercase();
        // "10km" is a number and a unit; "3rd" stays an ordinal.
        let digits = lower.len() - lower.trim_start_matches(|c: char| c.is_ascii_digit()).len();
        let rest = &lower[digits..];
        if digits > 0
            && !rest.is_empty()
            && rest.chars().all(char::is_alphabetic)
            && !matches!(rest, "st" | "nd" | "rd" | "th")
        {
            out.push((lower[..digits].to_string(), false));
            out.push((rest.to_string(), false));
            continue;
        }
        match contraction(&lower) {
            Some(parts) => out.extend(parts.into_iter().map(|s| (s.to_string(), cap))),
            None => out.push((lower, cap)),
        }
    }
}
