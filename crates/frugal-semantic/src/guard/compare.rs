//! Aligning two questions' words and reading what differs.

use super::veto::Veto;
use super::words::{COORDINATORS, Content, Modal, RELATIONS, Words, unit};
use crate::embed::{Embedder, cosine};
use crate::lexicon::{Lexicon, Relation};

/// Replaced spans at or above this embedder similarity say the same thing in other words
/// ("pick" / "choose" 0.7; "temperature" / "melting point" 0.12); set from the tuning half's
/// errors (`frugal eval-cache --tuning-errors`).
pub const SPAN_MIN: f32 = 0.6;

/// What the guard read in a pair.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Explain {
    pub veto: Option<Veto>,
    /// Content words on each side that nothing on the other side matched.
    pub replaced: (Vec<String>, Vec<String>),
    /// The embedder's similarity of the replaced spans, where WordNet could not relate them.
    pub span_similarity: Option<f32>,
}

impl Explain {
    /// Every content word found its match on the other side.
    pub fn aligned(&self) -> bool {
        self.replaced.0.is_empty() && self.replaced.1.is_empty()
    }
}

pub fn explain(a: &str, b: &str, lex: &Lexicon, embedder: Option<&Embedder>) -> Explain {
    let (wa, wb) = (Words::of(a, lex), Words::of(b, lex));
    let mut x = Explain {
        veto: fixed(&wa, &wb),
        ..Explain::default()
    };
    if x.veto.is_some() {
        return x;
    }
    let aligned = align(&wa.content, &wb.content, lex);
    x.replaced = (
        aligned
            .left
            .iter()
            .map(|&i| wa.content[i].word.clone())
            .collect(),
        aligned
            .right
            .iter()
            .map(|&i| wb.content[i].word.clone())
            .collect(),
    );
    let (veto, broader) = replaced(&wa, &wb, &aligned, lex);
    x.veto = veto;
    if x.veto.is_none() && degree_differs(&wa.degree, &wb.degree) {
        x.veto = Some(Veto::Degree);
    }
    if x.veto.is_none() && swapped(&wa, &wb, &aligned.same) {
        x.veto = Some(Veto::Swapped);
    }
    if x.veto.is_none() && !aligned.left.is_empty() && !aligned.right.is_empty() {
        // WordNet relates none of the replaced words: ask the embedder about the spans.
        let span = |w: &Words, idx: &[usize]| {
            idx.iter()
                .map(|&i| w.content[i].word.as_str())
                .collect::<Vec<_>>()
                .join(" ")
        };
        let similarity = embedder.and_then(|e| {
            let (l, r) = (
                e.embed(&span(&wa, &aligned.left)),
                e.embed(&span(&wb, &aligned.right)),
            );
            Some(cosine(&l.ok()?, &r.ok()?))
        });
        x.span_similarity = similarity;
        if similarity.is_none_or(|s| s < SPAN_MIN) {
            x.veto = Some(if broader {
                Veto::Broader
            } else {
                Veto::Content
            });
        }
    }
    x
}

/// Vetoes that need no alignment: numbers, code, units, negation, modality.
fn fixed(a: &Words, b: &Words) -> Option<Veto> {
    if a.numbers != b.numbers {
        return Some(Veto::Numbers);
    }
    if a.code != b.code {
        return Some(Veto::Code);
    }
    if a.units != b.units {
        return Some(Veto::Unit);
    }
    if a.order != b.order {
        return Some(Veto::Swapped);
    }
    if a.negations % 2 != b.negations % 2 {
        return Some(Veto::Negation);
    }
    // "Should I" for "How do I" is a rewording; "must" or "may" on one side only is not.
    let firm = |m: &[Modal]| m.iter().filter(|&&m| m != Modal::Should).count();
    if a.modals != b.modals && (firm(&a.modals) + firm(&b.modals) > 0) {
        return Some(Veto::Modal);
    }
    None
}

/// Content words matched across the two sides.
struct Aligned {
    /// Pairs with the same lemma, each lemma once on each side (for word order).
    same: Vec<(usize, usize)>,
    /// Unmatched on the left and on the right.
    left: Vec<usize>,
    right: Vec<usize>,
}

/// Match equal lemmas first, then synonyms and derived forms ("buy" / "purchase",
/// "invest" / "investment"); what is left was replaced, added or dropped.
fn align(a: &[Content], b: &[Content], lex: &Lexicon) -> Aligned {
    let mut used_b = vec![false; b.len()];
    let mut left = Vec::new();
    let mut same = Vec::new();
    for (i, x) in a.iter().enumerate() {
        match (0..b.len()).find(|&j| !used_b[j] && (b[j].lemma == x.lemma || b[j].word == x.word)) {
            Some(j) => {
                used_b[j] = true;
                let unique =
                    |c: &[Content], l: &str| c.iter().filter(|y| y.lemma == l).count() == 1;
                if unique(a, &x.lemma) && unique(b, &x.lemma) {
                    same.push((i, j));
                }
            }
            None => left.push(i),
        }
    }
    left.retain(|&i| {
        let close = (0..b.len()).find(|&j| {
            !used_b[j]
                && matches!(
                    lex.relation(&a[i].word, &b[j].word),
                    Relation::Same | Relation::Synonym | Relation::Derived
                )
        });
        if let Some(j) = close {
            used_b[j] = true;
        }
        close.is_none()
    });
    let mut right: Vec<usize> = (0..b.len()).filter(|&j| !used_b[j]).collect();
    joined(&mut left, &mut right, a, b);
    joined(&mut right, &mut left, b, a);
    Aligned { same, left, right }
}

/// One word on one side spelled as two adjacent ones on the other: "WiFi" / "Wi-Fi", or
/// their initials, "AC" / "air conditioning". Both leave the unmatched lists.
fn joined(one: &mut Vec<usize>, two: &mut Vec<usize>, a: &[Content], b: &[Content]) {
    one.retain(|&i| {
        let w = &a[i].word;
        let pair = two.windows(2).position(|p| {
            let (x, y) = (&b[p[0]], &b[p[1]]);
            let initials: String = x
                .word
                .chars()
                .take(1)
                .chain(y.word.chars().take(1))
                .collect();
            y.at == x.at + 1 && (format!("{}{}", x.word, y.word) == *w || initials == *w)
        });
        if let Some(p) = pair {
            two.drain(p..p + 2);
        }
        pair.is_none()
    });
}

/// The veto a replacement of content words calls for, by what WordNet says of the words:
/// opposites or siblings; names; and whether one is broader than the other (WordNet's verb
/// hierarchy makes near-synonyms such as "pick" / "choose" broader and narrower, so that
/// is left to the embedder).
fn replaced(a: &Words, b: &Words, al: &Aligned, lex: &Lexicon) -> (Option<Veto>, bool) {
    if al.left.is_empty() || al.right.is_empty() {
        // Detail on one side only: a capitalized name narrows the question to another.
        let caps = |w: &Words, idx: &[usize]| idx.iter().any(|&i| w.content[i].cap);
        return (
            (caps(a, &al.left) || caps(b, &al.right)).then_some(Veto::Entity),
            false,
        );
    }
    let (mut worst, mut broader) = (None, false);
    for &i in &al.left {
        for &j in &al.right {
            let v = match lex.relation(&a.content[i].word, &b.content[j].word) {
                Relation::Antonym => Veto::Antonym,
                Relation::CoHyponym => Veto::Cohyponym,
                Relation::Broader => {
                    broader = true;
                    continue;
                }
                _ => continue,
            };
            worst = Some(worst.map_or(v, |w: Veto| w.min(v)));
        }
    }
    let units = |w: &Words, idx: &[usize]| idx.iter().any(|&i| unit(&w.content[i].word).is_some());
    if worst.is_some() && (units(a, &al.left) || units(b, &al.right)) {
        worst = Some(Veto::Unit);
    }
    let names = |w: &Words, idx: &[usize]| idx.iter().any(|&i| w.content[i].name);
    let veto =
        worst.or_else(|| (names(a, &al.left) || names(b, &al.right)).then_some(Veto::Entity));
    (veto, broader)
}

/// Quantity words differ; "some" or "any" added where the other side has none is filler
/// ("What are (some) good books?").
fn degree_differs(a: &[&str], b: &[&str]) -> bool {
    let filler = |w: &&str| matches!(*w, "some" | "any" | "very" | "really");
    if a.is_empty() {
        return !b.iter().all(filler);
    }
    if b.is_empty() {
        return !a.iter().all(filler);
    }
    a != b
}

/// The same content words in another order around a relation. A relation word on both
/// sides that governs another word swaps the question ("dollars to rupees" / "rupees to
/// dollars", "A depends on B" / "B depends on A", "a type of wolf" / "a type of dog").
/// Otherwise moving one block of words elsewhere may reword it (see `moved_ok`); any other
/// reordering swaps roles ("A beats B" / "B beats A", "Is a wolf a dog?" / "Is a dog a
/// wolf?").
fn swapped(a: &Words, b: &Words, same: &[(usize, usize)]) -> bool {
    for &r in RELATIONS {
        let governed = |w: &Words, side: fn(&(usize, usize)) -> usize| -> Vec<usize> {
            same.iter()
                .enumerate()
                .filter(|(_, p)| w.content[side(p)].role == Some(r))
                .map(|(k, _)| k)
                .collect()
        };
        // The relation left one word for another: each side governs one the other does not.
        let (ga, gb) = (governed(a, |p| p.0), governed(b, |p| p.1));
        if ga.iter().any(|k| !gb.contains(k)) && gb.iter().any(|k| !ga.contains(k)) {
            return true;
        }
    }
    // Matched words in A's order, as ranks in B; coordinated neighbours count as one.
    let mut order: Vec<(usize, usize)> = same.iter().map(|&(i, j)| (a.content[i].at, j)).collect();
    order.sort_unstable();
    let mut ranks: Vec<usize> = order.iter().map(|&(_, j)| b.content[j].at).collect();
    let coordinated = |w: &Words, x: usize, y: usize| {
        let (lo, hi) = (x.min(y), x.max(y));
        hi - lo <= 3
            && w.all[lo + 1..hi]
                .iter()
                .any(|t| COORDINATORS.contains(&t.as_str()))
    };
    // Undo coordinated pairs that traded places ("A or B" / "B or A").
    for k in 1..ranks.len() {
        let (pa, pb) = (order[k - 1].0, order[k].0);
        if ranks[k] < ranks[k - 1]
            && coordinated(a, pa, pb)
            && coordinated(b, ranks[k], ranks[k - 1])
        {
            ranks.swap(k - 1, k);
        }
    }
    // One block moved: a rewording if it carries its relation word along ("to B from A"),
    // trades "of" for a possessive ("X's population"), is set off by a comma, reorders a
    // coordination ("quinoa or brown rice"), or turns a compound into a phrase ("a name
    // change" / "change my name").
    let moved_ok = |run: std::ops::Range<usize>| {
        let (first_a, last_a) = (order[run.start].0, order[run.end - 1].0);
        let (first_b, last_b) = (ranks[run.start], ranks[run.end - 1]);
        let (ra, rb) = (role_at(a, first_a), role_at(b, first_b));
        let kept = ra.is_some() && ra == rb;
        let genitive = matches!((ra, rb), (None, Some("of")) | (Some("of"), None));
        // The run and the words it jumped over, in each text.
        let jumped: Vec<usize> = (0..ranks.len())
            .filter(|k| !run.contains(k) && ((*k < run.start) != (ranks[*k] < first_b)))
            .chain(run.clone())
            .collect();
        let span = |pos: &dyn Fn(usize) -> usize| {
            let lo = jumped.iter().map(|&k| pos(k)).min().unwrap_or(0);
            let hi = jumped.iter().map(|&k| pos(k)).max().unwrap_or(0);
            lo..hi + 1
        };
        let (sa, sb) = (span(&|k| order[k].0), span(&|k| ranks[k]));
        let has = |w: &Words, s: &std::ops::Range<usize>, words: &[&str]| {
            w.all[s.clone()].iter().any(|t| words.contains(&t.as_str()))
        };
        let coordination = has(a, &sa, COORDINATORS) && has(b, &sb, COORDINATORS);
        let compound = sa.len() == jumped.len() || sb.len() == jumped.len();
        kept || genitive
            || coordination
            || compound
            || set_off(a, first_a, last_a)
            || set_off(b, first_b, last_b)
    };
    !ascending(&ranks) && !block_moves(&ranks).into_iter().any(moved_ok)
}

fn role_at(w: &Words, at: usize) -> Option<&'static str> {
    w.content.iter().find(|c| c.at == at).and_then(|c| c.role)
}

/// Whether the words from `first` to `last` are set off by a comma on either side, with
/// only function words between them and the comma.
fn set_off(w: &Words, first: usize, last: usize) -> bool {
    let is_content = |k: &usize| w.content.iter().any(|c| c.at == *k);
    let comma = |k: usize| w.all[k] == ",";
    (0..first).rev().take_while(|k| !is_content(k)).any(comma)
        || (last + 1..w.all.len())
            .take_while(|k| !is_content(k))
            .any(comma)
}

fn ascending(v: &[usize]) -> bool {
    v.windows(2).all(|w| w[0] < w[1])
}

/// The runs whose move elsewhere would make `ranks` ascending.
fn block_moves(ranks: &[usize]) -> Vec<std::ops::Range<usize>> {
    let n = ranks.len();
    let mut runs = Vec::new();
    // Take out each ascending run [i, j): the rest must be ascending and the run fit in
    // one gap of it.
    for i in 0..n {
        for j in i + 1..=n {
            let run = &ranks[i..j];
            if !ascending(run) {
                break;
            }
            let rest: Vec<usize> = ranks[..i].iter().chain(&ranks[j..]).copied().collect();
            let (lo, hi) = (run[0], run[run.len() - 1]);
            let gap = rest.iter().filter(|&&x| x < lo).count();
            if ascending(&rest) && rest.iter().filter(|&&x| x < hi).count() == gap {
                runs.push(i..j);
            }
        }
    }
    runs
}
