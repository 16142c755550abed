//! WordNet 3.1, embedded: how two words relate.
//!
//! The semantic cache's guard must tell a near-identical question that means something else
//! ("cheapest" / "most expensive", "Paris" / "Rome") from one that only says it in other words
//! ("buy" / "purchase", "invest" / "investment"). [`Lexicon::relation`] answers that for one
//! pair of words from WordNet's lemmas, synsets and pointers.
//!
//! The data is `data/lexicon/wordnet.tsv.gz` (a subset of WordNet 3.1 written by
//! `scripts/build-lexicon.py`, whose docstring describes the format; source, license and the
//! command that regenerates it are in `data/lexicon/PROVENANCE.md`). It is compiled into the
//! binary and parsed once, on first use.
//!
//! Every relation holds between *some* sense of each word: WordNet does not know which sense
//! a question means, so a polysemous word relates to many others ("bank" is both a slope and
//! a company). The weaker forms of a relation (through adjective clusters or derived forms)
//! are only tried once the stronger evidence of sameness (a shared synset, a derivational
//! link) is absent, so that a rare sense does not turn two synonyms into antonyms.

use std::io::Read;
use std::sync::OnceLock;

use flate2::read::GzDecoder;

static DATA: &[u8] = include_bytes!("../../../data/lexicon/wordnet.tsv.gz");

/// How two words relate in WordNet.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Relation {
    /// The same lemma (after morphological reduction: "cheapest" ~ "cheap", "children" ~ "child", "went" ~ "go").
    Same,
    /// Opposites: a lexical antonym pointer between some sense of each, also through adjective
    /// similar-to clusters ("hot"/"icy") and derived forms ("increase"/"decrease" as verbs and
    /// nouns; "cheaply"/"expensive" through "cheap").
    Antonym,
    /// Share a synset in some sense ("buy"/"purchase", "car"/"automobile", "film"/"movie"), or,
    /// when nothing else holds, one is a satellite adjective of the other's cluster
    /// ("costly"/"expensive").
    Synonym,
    /// Derivationally related or pertainym ("invest"/"investment", "cheap"/"cheaply", "decide"/"decision").
    Derived,
    /// One is a kind of (or instance of) the other, up to 4 levels ("laptop"/"computer", "paris"/"city").
    Broader,
    /// Siblings: senses that share a hypernym or instance hypernym at most 4 links away in all
    /// (2 up each, or 3 and 1), and not too general (see `GENERAL_SHARE`), without being
    /// synonyms ("paris"/"rome", "cat"/"dog", "car"/"bicycle", "violin"/"cello",
    /// "monday"/"friday", "breakfast"/"dinner"; "north"/"south" are siblings as nouns but
    /// antonyms as adjectives, so Antonym), or adjectives in different similar-to clusters of
    /// the same attribute ("warm"/"hot").
    CoHyponym,
    /// Both known to WordNet, no relation above.
    Unrelated,
    /// At least one of the two is not in WordNet (a name, a typo, a code identifier).
    Unknown,
}

/// Parts of speech, as bits of a mask.
const NOUN: u8 = 1;
const VERB: u8 = 2;
const ADJ: u8 = 4;
const ADV: u8 = 8;

/// A synset's type byte as in WordNet: `n`, `v`, `a` (head adjective), `s` (satellite
/// adjective), `r`.
const SATELLITE: u8 = b's';

/// WordNet 3.1's noun and verb synset counts (data.noun and data.verb).
const NOUN_SYNSETS: u32 = 82_192;
const VERB_SYNSETS: u32 = 13_789;

/// A common ancestor too general to make its descendants siblings: one with more than 1/40 of
/// its part of speech's synsets below it (hyponyms and instance hyponyms, counted once each).
/// For nouns that is 2,054, which rules out "entity", "abstract entity", "organism" (19,437),
/// "artifact" (10,720), "person" (10,286), "act" (6,884) but keeps "city" (918), "wheeled
/// vehicle" (229), "meal" (32); for verbs 344, which rules out the broadest senses of "change"
/// (1,708), "act" (1,069), "move" (1,039), "make" (659), "communicate" (624) but keeps "get"
/// (145) and "consume" (83). A depth cut would treat the shallow verb hierarchy and the deep
/// noun one alike; a share of each does not.
const GENERAL_SHARE: u32 = 40;

/// Hypernym links followed for `Broader`: laptop -> portable computer -> personal computer ->
/// digital computer -> computer is four.
const BROADER_LEVELS: u8 = 4;

/// Most links, in both directions together, from two senses to a common ancestor for
/// `CoHyponym`: car -> motor vehicle -> self-propelled vehicle -> wheeled vehicle <- bicycle
/// is four, as is cat -> feline -> carnivore <- canine <- dog.
const COHYPONYM_LINKS: u8 = 4;

/// WordNet's morphy suffix rules: (part of speech, inflected ending, base ending).
const RULES: &[(u8, &str, &str)] = &[
    (NOUN, "s", ""),
    (NOUN, "ses", "s"),
    (NOUN, "xes", "x"),
    (NOUN, "zes", "z"),
    (NOUN, "ches", "ch"),
    (NOUN, "shes", "sh"),
    (NOUN, "men", "man"),
    (NOUN, "ies", "y"),
    (VERB, "s", ""),
    (VERB, "ies", "y"),
    (VERB, "es", "e"),
    (VERB, "es", ""),
    (VERB, "ed", "e"),
    (VERB, "ed", ""),
    (VERB, "ing", "e"),
    (VERB, "ing", ""),
    (ADJ, "er", ""),
    (ADJ, "est", ""),
    (ADJ, "er", "e"),
    (ADJ, "est", "e"),
];

/// Lists in compressed sparse row form: row `i` is `items[start[i]..start[i + 1]]`.
#[derive(Default)]
struct Csr {
    start: Vec<u32>,
    items: Vec<u32>,
}

impl Csr {
    fn new() -> Csr {
        Csr {
            start: vec![0],
            items: Vec::new(),
        }
    }

    fn row(&self, i: u32) -> &[u32] {
        let i = i as usize;
        match (self.start.get(i), self.start.get(i + 1)) {
            (Some(&a), Some(&b)) => self.items.get(a as usize..b as usize).unwrap_or(&[]),
            _ => &[],
        }
    }

    /// Ends the row being pushed.
    fn end_row(&mut self) {
        self.start.push(self.items.len() as u32);
    }

    /// `rows` rows from (row, item) pairs, each row sorted and without duplicates.
    fn from_pairs(rows: usize, mut pairs: Vec<(u32, u32)>) -> Csr {
        pairs.sort_unstable();
        pairs.dedup();
        let mut csr = Csr::new();
        let mut it = pairs.into_iter().peekable();
        for r in 0..rows as u32 {
            while let Some(&(_, item)) = it.peek().filter(|p| p.0 == r) {
                csr.items.push(item);
                it.next();
            }
            csr.end_row();
        }
        csr
    }
}

/// One irregular form and its base lemmas, for one part of speech.
struct Exception {
    form: Box<str>,
    pos: u8,
    bases: Box<[u32]>,
}

/// WordNet's single-word lemmas, synsets and the pointers between them.
#[derive(Default)]
pub struct Lexicon {
    /// Per synset: its type byte (n v a s r).
    kind: Vec<u8>,
    /// Per synset: distinct hyponyms and instance hyponyms below it in the whole of WordNet.
    descendants: Vec<u32>,
    /// Per synset: hypernyms and instance hypernyms.
    hypernyms: Csr,
    /// Per synset: similar-to (adjectives; a satellite's row is its cluster head).
    similar: Csr,
    /// Per synset: attribute nouns (head adjectives).
    attributes: Csr,
    /// Per synset: the synsets some word of which is an antonym of some word of this one.
    antonyms: Csr,
    /// The lemmas, sorted, concatenated; lemma `i` is `names[name_start[i]..name_start[i + 1]]`.
    names: String,
    name_start: Vec<u32>,
    /// Per lemma: its parts of speech.
    pos: Vec<u8>,
    /// Per lemma: its synsets.
    senses: Csr,
    /// Per lemma: lemmas derivationally related to it or pertainyms either way.
    derived: Csr,
    /// Per lemma: the synsets of those lemmas' senses that its derivational links reach.
    derived_senses: Csr,
    /// Irregular forms, sorted by form.
    exceptions: Vec<Exception>,
}

impl Lexicon {
    /// The embedded WordNet, parsed once.
    pub fn get() -> &'static Lexicon {
        static LEXICON: OnceLock<Lexicon> = OnceLock::new();
        // The data is compiled in and checked by the tests; an unreadable copy would make
        // every word Unknown rather than bring the process down.
        LEXICON.get_or_init(|| Lexicon::parse(DATA).unwrap_or_default())
    }

    /// Whether WordNet knows the word in any form.
    pub fn knows(&self, word: &str) -> bool {
        !self.lemma_ids(word).is_empty()
    }

    /// The word's base forms (WordNet's morphy: exception lists, then suffix rules), lowercase; empty if unknown.
    pub fn lemmas(&self, word: &str) -> Vec<String> {
        self.lemma_ids(word)
            .into_iter()
            .map(|id| self.name(id).to_string())
            .collect()
    }

    /// How `a` relates to `b`, taking the first that holds in this order: Same, Antonym, Synonym, Derived, Broader, CoHyponym, Unrelated (Unknown if either is unknown). Case-insensitive.
    ///
    /// Inside that order each relation is tried strongest evidence first: a direct or
    /// indirect antonym (one word in the synset that carries the antonym pointer, the other
    /// in it or in a satellite of the opposite head), then a shared synset, then satellites
    /// of two opposite heads ("rare"/"well-done"), then a derivational link, then an antonym
    /// reached through one derivational link (only when neither word's derived forms are
    /// senses of the other), then hypernymy and co-hyponymy, then a satellite of the other's
    /// head as a last Synonym.
    pub fn relation(&self, a: &str, b: &str) -> Relation {
        let (la, lb) = (self.lemma_ids(a), self.lemma_ids(b));
        if la.is_empty() || lb.is_empty() {
            return Relation::Unknown;
        }
        if la.iter().any(|x| lb.contains(x)) {
            return Relation::Same;
        }
        let (sa, sb) = (self.senses_of(&la), self.senses_of(&lb));
        if self.opposed(&sa, &sb) {
            return Relation::Antonym;
        }
        if intersects(&sa, &sb) {
            return Relation::Synonym;
        }
        if self.opposed_clusters(&sa, &sb) {
            return Relation::Antonym;
        }
        if la
            .iter()
            .any(|&x| self.derived.row(x).iter().any(|y| lb.contains(y)))
        {
            return Relation::Derived;
        }
        let (da, db) = (self.derived_of(&la), self.derived_of(&lb));
        if !intersects(&da, &sb)
            && !intersects(&db, &sa)
            && (self.opposed(&da, &sb) || self.opposed(&sa, &db) || self.opposed(&da, &db))
        {
            return Relation::Antonym;
        }
        let (aa, ab) = (
            self.ancestors(&sa, BROADER_LEVELS),
            self.ancestors(&sb, BROADER_LEVELS),
        );
        if aa.iter().any(|(c, _)| sb.binary_search(c).is_ok())
            || ab.iter().any(|(c, _)| sa.binary_search(c).is_ok())
        {
            return Relation::Broader;
        }
        if self.common_ancestor(&aa, &ab) || self.same_attribute(&sa, &sb) {
            return Relation::CoHyponym;
        }
        if self.satellite_of(&sa, &sb) || self.satellite_of(&sb, &sa) {
            return Relation::Synonym;
        }
        Relation::Unrelated
    }

    fn name(&self, id: u32) -> &str {
        let i = id as usize;
        match (self.name_start.get(i), self.name_start.get(i + 1)) {
            (Some(&a), Some(&b)) => self.names.get(a as usize..b as usize).unwrap_or(""),
            _ => "",
        }
    }

    fn lemma_id(&self, word: &str) -> Option<u32> {
        let n = self.name_start.len().saturating_sub(1) as u32;
        let (mut lo, mut hi) = (0u32, n);
        while lo < hi {
            let mid = lo + (hi - lo) / 2;
            match self.name(mid).cmp(word) {
                std::cmp::Ordering::Less => lo = mid + 1,
                std::cmp::Ordering::Greater => hi = mid,
                std::cmp::Ordering::Equal => return Some(mid),
            }
        }
        None
    }

    /// A lemma with this part of speech.
    fn lemma_with(&self, word: &str, pos: u8) -> Option<u32> {
        self.lemma_id(word)
            .filter(|&id| self.pos.get(id as usize).is_some_and(|p| p & pos != 0))
    }

    /// WordNet's morphy over all four parts of speech: for each, the word itself if it is a
    /// lemma of that part of speech, and its exception-list bases or else the suffix rules'
    /// results that are.
    fn lemma_ids(&self, word: &str) -> Vec<u32> {
        let word = word.trim().to_lowercase().replace('\u{2019}', "'");
        let mut out: Vec<u32> = Vec::new();
        let mut push = |id: u32| {
            if !out.contains(&id) {
                out.push(id);
            }
        };
        if word.is_empty() {
            return Vec::new();
        }
        let first = self
            .exceptions
            .partition_point(|e| e.form.as_ref() < word.as_str());
        for pos in [NOUN, VERB, ADJ, ADV] {
            if let Some(id) = self.lemma_with(&word, pos) {
                push(id);
            }
            let exception = self.exceptions[first..]
                .iter()
                .take_while(|e| e.form.as_ref() == word)
                .find(|e| e.pos == pos);
            if let Some(e) = exception {
                e.bases.iter().for_each(|&id| push(id));
                continue;
            }
            for &(rule_pos, ending, base) in RULES {
                if rule_pos != pos {
                    continue;
                }
                if let Some(stem) = word.strip_suffix(ending).filter(|s| !s.is_empty()) {
                    let candidate = format!("{stem}{base}");
                    if let Some(id) = self.lemma_with(&candidate, pos) {
                        push(id);
                    }
                }
            }
        }
        out
    }

    /// The synsets of these lemmas, sorted.
    fn senses_of(&self, lemmas: &[u32]) -> Vec<u32> {
        let mut out: Vec<u32> = lemmas
            .iter()
            .flat_map(|&l| self.senses.row(l))
            .copied()
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// The synsets that these lemmas' derivational and pertainym links reach, sorted.
    fn derived_of(&self, lemmas: &[u32]) -> Vec<u32> {
        let mut out: Vec<u32> = lemmas
            .iter()
            .flat_map(|&l| self.derived_senses.row(l))
            .copied()
            .collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    fn kind(&self, synset: u32) -> u8 {
        self.kind.get(synset as usize).copied().unwrap_or(0)
    }

    /// The synset itself and, for a satellite adjective, its cluster head(s).
    fn heads(&self, synset: u32) -> impl Iterator<Item = u32> + '_ {
        let satellite = self.kind(synset) == SATELLITE;
        std::iter::once(synset).chain(
            self.similar
                .row(synset)
                .iter()
                .copied()
                .filter(move |_| satellite),
        )
    }

    /// Direct or indirect antonyms: a synset of one side, or the head of its cluster, has an
    /// antonym among the other side's synsets.
    fn opposed(&self, a: &[u32], b: &[u32]) -> bool {
        let one_way = |x: &[u32], y: &[u32]| {
            x.iter().any(|&s| {
                self.heads(s).any(|h| {
                    self.antonyms
                        .row(h)
                        .iter()
                        .any(|t| y.binary_search(t).is_ok())
                })
            })
        };
        one_way(a, b) || one_way(b, a)
    }

    /// Satellites (or heads) of two clusters whose heads are antonyms.
    fn opposed_clusters(&self, a: &[u32], b: &[u32]) -> bool {
        let heads_b = self.all_heads(b);
        a.iter().any(|&s| {
            self.heads(s).any(|h| {
                self.antonyms
                    .row(h)
                    .iter()
                    .any(|t| heads_b.binary_search(t).is_ok())
            })
        })
    }

    fn all_heads(&self, synsets: &[u32]) -> Vec<u32> {
        let mut out: Vec<u32> = synsets.iter().flat_map(|&s| self.heads(s)).collect();
        out.sort_unstable();
        out.dedup();
        out
    }

    /// A satellite adjective among `a` whose head is among `b`.
    fn satellite_of(&self, a: &[u32], b: &[u32]) -> bool {
        a.iter().any(|&s| {
            self.kind(s) == SATELLITE
                && self
                    .similar
                    .row(s)
                    .iter()
                    .any(|h| b.binary_search(h).is_ok())
        })
    }

    /// Every hypernym or instance hypernym at most `levels` links above any of `synsets`,
    /// with the fewest links to it, sorted by synset.
    fn ancestors(&self, synsets: &[u32], levels: u8) -> Vec<(u32, u8)> {
        let mut out: Vec<(u32, u8)> = Vec::new();
        let mut frontier: Vec<u32> = Vec::new();
        let mut next: Vec<u32> = Vec::new();
        for &s in synsets {
            frontier.clear();
            frontier.push(s);
            for depth in 1..=levels {
                next.clear();
                for &x in &frontier {
                    for &h in self.hypernyms.row(x) {
                        out.push((h, depth));
                        next.push(h);
                    }
                }
                if next.is_empty() {
                    break;
                }
                std::mem::swap(&mut frontier, &mut next);
            }
        }
        out.sort_unstable();
        out.dedup_by_key(|p| p.0);
        out
    }

    /// Whether a synset has too many descendants to make two of them siblings.
    fn general(&self, synset: u32) -> bool {
        let limit = match self.kind(synset) {
            b'n' => NOUN_SYNSETS / GENERAL_SHARE,
            b'v' => VERB_SYNSETS / GENERAL_SHARE,
            _ => 0,
        };
        self.descendants.get(synset as usize).copied().unwrap_or(0) > limit
    }

    /// A common ancestor, not too general, at most `COHYPONYM_LINKS` links from both.
    fn common_ancestor(&self, a: &[(u32, u8)], b: &[(u32, u8)]) -> bool {
        let (mut i, mut j) = (0, 0);
        while let (Some(&(x, dx)), Some(&(y, dy))) = (a.get(i), b.get(j)) {
            match x.cmp(&y) {
                std::cmp::Ordering::Less => i += 1,
                std::cmp::Ordering::Greater => j += 1,
                std::cmp::Ordering::Equal => {
                    if dx + dy <= COHYPONYM_LINKS && !self.general(x) {
                        return true;
                    }
                    i += 1;
                    j += 1;
                }
            }
        }
        false
    }

    /// Adjectives in two different clusters whose heads share an attribute ("warm"/"hot":
    /// temperature).
    fn same_attribute(&self, a: &[u32], b: &[u32]) -> bool {
        let adjective_heads = |x: &[u32]| -> Vec<u32> {
            let mut h: Vec<u32> = x
                .iter()
                .filter(|&&s| matches!(self.kind(s), b'a' | SATELLITE))
                .flat_map(|&s| self.heads(s))
                .filter(|&h| !self.attributes.row(h).is_empty())
                .collect();
            h.sort_unstable();
            h.dedup();
            h
        };
        let (ha, hb) = (adjective_heads(a), adjective_heads(b));
        ha.iter().any(|&x| {
            hb.iter().any(|&y| {
                x != y
                    && self
                        .attributes
                        .row(x)
                        .iter()
                        .any(|t| self.attributes.row(y).contains(t))
            })
        })
    }

    /// Parses the gzip-compressed text that `scripts/build-lexicon.py` writes.
    fn parse(gz: &[u8]) -> Result<Lexicon, String> {
        // gzip's last four bytes are the uncompressed size (mod 2^32), little-endian.
        let size = gz
            .last_chunk::<4>()
            .map_or(0, |b| u32::from_le_bytes(*b) as usize);
        let mut text = String::with_capacity(size.min(64 << 20));
        GzDecoder::new(gz)
            .read_to_string(&mut text)
            .map_err(|e| format!("lexicon: {e}"))?;
        let mut lines = text.lines().filter(|l| !l.starts_with('#'));
        let mut lex = Lexicon {
            hypernyms: Csr::new(),
            similar: Csr::new(),
            attributes: Csr::new(),
            name_start: vec![0],
            senses: Csr::new(),
            ..Lexicon::default()
        };

        let synsets = section(&mut lines, "S")?;
        lex.kind.reserve(synsets);
        lex.descendants.reserve(synsets);
        for _ in 0..synsets {
            let line = lines.next().ok_or("lexicon: synsets cut short")?;
            let mut f = line.split('\t');
            let kind = f
                .next()
                .and_then(|k| k.bytes().next())
                .ok_or("bad synset")?;
            lex.kind.push(kind);
            for _ in 0..2 {
                push_ids(&mut lex.hypernyms.items, f.next(), synsets)?;
            }
            lex.hypernyms.end_row();
            push_ids(&mut lex.similar.items, f.next(), synsets)?;
            lex.similar.end_row();
            push_ids(&mut lex.attributes.items, f.next(), synsets)?;
            lex.attributes.end_row();
            let d = f.next().unwrap_or("");
            lex.descendants
                .push(if d.is_empty() { 0 } else { number(d)? });
        }

        let lemmas = section(&mut lines, "L")?;
        lex.pos.reserve(lemmas);
        for _ in 0..lemmas {
            let line = lines.next().ok_or("lexicon: lemmas cut short")?;
            let (name, ids) = line.split_once('\t').ok_or("bad lemma")?;
            if !lex.pos.is_empty() && lex.name(lex.pos.len() as u32 - 1) >= name {
                return Err(format!("lexicon: lemmas not sorted at {name}"));
            }
            lex.names.push_str(name);
            lex.name_start.push(lex.names.len() as u32);
            push_ids(&mut lex.senses.items, Some(ids), synsets)?;
            lex.senses.end_row();
            let pos = lex
                .senses
                .row(lex.pos.len() as u32)
                .iter()
                .map(|&s| match lex.kind(s) {
                    b'n' => NOUN,
                    b'v' => VERB,
                    b'a' | SATELLITE => ADJ,
                    b'r' => ADV,
                    _ => 0,
                })
                .fold(0, |m, p| m | p);
            lex.pos.push(pos);
        }

        let pointers = section(&mut lines, "P")?;
        let (mut antonyms, mut derived, mut derived_senses) = (vec![], vec![], vec![]);
        for _ in 0..pointers {
            let line = lines.next().ok_or("lexicon: pointers cut short")?;
            let mut f = line.split('\t');
            let (Some(sym), Some(sa), Some(la), Some(sb), Some(lb), None) =
                (f.next(), f.next(), f.next(), f.next(), f.next(), f.next())
            else {
                return Err(format!("lexicon: bad pointer {line}"));
            };
            let (sa, sb) = (id(sa, synsets)?, id(sb, synsets)?);
            let (la, lb) = (id(la, lemmas)?, id(lb, lemmas)?);
            if sym == "!" {
                antonyms.extend([(sa, sb), (sb, sa)]);
            } else {
                derived.extend([(la, lb), (lb, la)]);
                derived_senses.extend([(la, sb), (lb, sa)]);
            }
        }
        lex.antonyms = Csr::from_pairs(synsets, antonyms);
        lex.derived = Csr::from_pairs(lemmas, derived);
        lex.derived_senses = Csr::from_pairs(lemmas, derived_senses);

        let exceptions = section(&mut lines, "X")?;
        for _ in 0..exceptions {
            let line = lines.next().ok_or("lexicon: exceptions cut short")?;
            let f: Vec<&str> = line.split('\t').collect();
            let [pos, form, bases] = f[..] else {
                return Err(format!("lexicon: bad exception {line}"));
            };
            let pos = match pos {
                "n" => NOUN,
                "v" => VERB,
                "a" => ADJ,
                "r" => ADV,
                _ => return Err(format!("lexicon: bad exception {line}")),
            };
            let bases = bases
                .split(' ')
                .filter_map(|b| lex.lemma_id(b))
                .collect::<Vec<u32>>()
                .into_boxed_slice();
            lex.exceptions.push(Exception {
                form: form.into(),
                pos,
                bases,
            });
        }
        lex.exceptions
            .sort_by(|x, y| (x.form.as_ref(), x.pos).cmp(&(y.form.as_ref(), y.pos)));
        Ok(lex)
    }
}

/// Whether two sorted lists share an element.
fn intersects(a: &[u32], b: &[u32]) -> bool {
    let (mut i, mut j) = (0, 0);
    while let (Some(x), Some(y)) = (a.get(i), b.get(j)) {
        match x.cmp(y) {
            std::cmp::Ordering::Less => i += 1,
            std::cmp::Ordering::Greater => j += 1,
            std::cmp::Ordering::Equal => return true,
        }
    }
    false
}

/// Reads a section header `<letter>\t<count>`.
fn section<'a>(lines: &mut impl Iterator<Item = &'a str>, letter: &str) -> Result<usize, String> {
    let line = lines.next().unwrap_or("");
    match line.split_once('\t') {
        Some((l, n)) if l == letter => Ok(number(n)? as usize),
        _ => Err(format!(
            "lexicon: expected section {letter}, found {line:?}"
        )),
    }
}

fn number(s: &str) -> Result<u32, String> {
    s.parse().map_err(|_| format!("lexicon: bad number {s:?}"))
}

/// An id below `bound`.
fn id(s: &str, bound: usize) -> Result<u32, String> {
    let n = number(s)?;
    if (n as usize) < bound {
        Ok(n)
    } else {
        Err(format!("lexicon: id {n} out of range"))
    }
}

/// Appends a space-separated list of ids below `bound` (an absent or empty field is none).
fn push_ids(out: &mut Vec<u32>, field: Option<&str>, bound: usize) -> Result<(), String> {
    for s in field.unwrap_or("").split(' ').filter(|s| !s.is_empty()) {
        out.push(id(s, bound)?);
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use Relation::*;

    #[test]
    fn loads_and_knows_common_words() {
        let lex = Lexicon::get();
        assert!(lex.knows("dog"));
        assert!(lex.knows("Dog"));
        assert!(lex.knows("dogs"));
        assert!(!lex.knows("zyntara"));
        assert!(!lex.knows(""));
        assert!(lex.kind.len() > 90_000, "{} synsets", lex.kind.len());
        assert!(lex.pos.len() > 80_000, "{} lemmas", lex.pos.len());
    }

    #[test]
    fn morphy() {
        let lex = Lexicon::get();
        assert_eq!(lex.lemmas("cheapest"), ["cheap"]);
        assert_eq!(lex.lemmas("children"), ["child"]);
        assert_eq!(lex.lemmas("went"), ["go"]);
        assert_eq!(lex.lemmas("better"), ["better", "good", "well"]);
        assert_eq!(lex.lemmas("Mice"), ["mouse"]);
        assert_eq!(lex.lemmas("boxes"), ["box"]);
        assert_eq!(lex.lemmas("investments"), ["investment"]);
        assert!(lex.lemmas("running").contains(&"run".to_string()));
        assert!(lex.lemmas("xq7").is_empty());
    }

    /// (a, b, what WordNet 3.1 gives).
    const PAIRS: &[(&str, &str, Relation)] = &[
        // Same lemma after morphy.
        ("went", "go", Same),
        ("children", "child", Same),
        ("best", "good", Same),
        ("Dogs", "dog", Same),
        ("tuesday", "Tuesday", Same),
        // Antonyms.
        ("cheapest", "expensive", Antonym), // through the lemma "cheap"
        ("cheap", "expensive", Antonym),
        ("increase", "decrease", Antonym), // as verbs and as nouns
        ("increasing", "decreased", Antonym),
        ("hot", "cold", Antonym),
        ("hot", "icy", Antonym), // "icy" is a satellite of "cold"
        ("buy", "sell", Antonym),
        ("purchase", "sell", Antonym), // "purchase" shares the synset that "buy" is in
        ("best", "worst", Antonym),
        ("win", "lose", Antonym),
        ("minimum", "maximum", Antonym),
        // WordNet has "north"/"south" as antonym adjectives and adverbs, which come before
        // their noun senses (cardinal compass points, siblings).
        ("north", "south", Antonym),
        ("east", "west", Antonym),
        // "rare" (of meat) is a satellite of "raw", "well-done" of "cooked"; raw ! cooked.
        ("rare", "well-done", Antonym),
        ("cheaply", "expensive", Antonym), // cheaply \ cheap ! expensive
        ("buyer", "seller", Antonym),      // buyer + buy ! sell + seller
        // Synonyms.
        ("buy", "purchase", Synonym),
        ("car", "automobile", Synonym),
        ("film", "movie", Synonym),
        ("big", "large", Synonym),
        ("begin", "start", Synonym),
        // WordNet 3.1 puts the adverb "quick" in the synset {promptly, quickly, quick}: a
        // shared synset comes before the pertainym link.
        ("quick", "quickly", Synonym),
        ("costly", "expensive", Synonym), // satellite of the head "expensive"
        // Derived forms and pertainyms.
        ("invest", "investment", Derived),
        ("decide", "decision", Derived),
        ("cheap", "cheaply", Derived),
        ("introduce", "introduction", Derived),
        ("atomic", "atom", Derived),
        // Broader: hypernym or instance hypernym within 4 links.
        ("laptop", "computer", Broader),
        ("computer", "laptop", Broader),
        ("paris", "city", Broader),
        ("dog", "animal", Broader),
        ("sparrow", "bird", Broader),
        // Co-hyponyms.
        ("paris", "rome", CoHyponym),
        ("london", "paris", CoHyponym),
        ("france", "germany", CoHyponym),
        ("cat", "dog", CoHyponym),
        ("car", "bicycle", CoHyponym),
        ("car", "truck", CoHyponym),
        ("violin", "cello", CoHyponym),
        ("monday", "friday", CoHyponym),
        ("january", "march", CoHyponym),
        ("breakfast", "dinner", CoHyponym),
        ("red", "blue", CoHyponym),
        ("coffee", "tea", CoHyponym),
        ("dollar", "euro", CoHyponym),
        ("mile", "kilometer", CoHyponym),
        ("celsius", "fahrenheit", CoHyponym),
        ("run", "walk", CoHyponym),
        ("warm", "hot", CoHyponym), // heads of two clusters of the attribute temperature
        // Unrelated.
        ("car", "idea", Unrelated),
        ("house", "idea", Unrelated),
        ("computer", "idea", Unrelated),
        ("laptop", "machine", Unrelated), // five links up: beyond Broader's reach
        // WordNet 3.1 has "freezing" only as a noun and (through "freeze") a verb.
        ("hot", "freezing", Unrelated),
        // WordNet 3.1's adverb "fast" is its own synset, and "quickly" pertains to "quick".
        ("quickly", "fast", Unrelated),
        // Unknown.
        ("zyntara", "korvex", Unknown),
        ("dog", "korvex", Unknown),
        ("getUserById", "user", Unknown),
    ];

    #[test]
    fn relations() {
        let lex = Lexicon::get();
        let wrong: Vec<String> = PAIRS
            .iter()
            .filter_map(|&(a, b, want)| {
                let got = lex.relation(a, b);
                (got != want).then(|| format!("{a}/{b}: {got:?}, want {want:?}"))
            })
            .collect();
        assert!(wrong.is_empty(), "{wrong:#?}");
        let kinds = [
            Same, Antonym, Synonym, Derived, Broader, CoHyponym, Unrelated, Unknown,
        ];
        for kind in kinds {
            assert!(PAIRS.iter().any(|p| p.2 == kind), "no pair for {kind:?}");
        }
    }

    #[test]
    fn symmetric() {
        let lex = Lexicon::get();
        for &(a, b, want) in PAIRS {
            assert_eq!(lex.relation(b, a), want, "{b}/{a}");
        }
    }

    #[test]
    fn parse_rejects_garbage() {
        assert!(Lexicon::parse(b"not gzip").is_err());
    }
}
