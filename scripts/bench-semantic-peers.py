#!/usr/bin/env python3
"""The semantic cache's peers on frugal's own pairs: GPTCache as its users run it, and plain
cosine over three embedders, on the held-out halves that `frugal eval-cache` reports.

Pairs: the hand-written files of data/semantic-cache (nearmiss.json, and
reworded-paraphrases.json / reworded-nearmiss.json where present) and QQP
(similiar_qqp_full.json.gz). Every file is split exactly as `frugal eval-cache` splits it: FNV-1a
64 over text_a, a zero byte and text_b; held out when (h % 10000) / 10000 < 0.5. QQP is bounded
to the first `--qqp-limit` pairs of each half in file order (the output says how many).

Systems, each asked "is text_b served text_a's answer?":
- `gptcache@0.8`: GPTCache as `gptcache.adapter.api.init_similar_cache` builds it (sqlite +
  faiss data manager, `SearchDistanceEvaluation()`, `temperature_softmax` post-processing,
  top_k 1) with its default `Config(similarity_threshold=0.8)`. The embedding is all-MiniLM-L6-v2
  through `MiniLMEmbedding` below: a small adapter implementing GPTCache's `BaseEmbedding` that
  reproduces what GPTCache's own `SBERT("all-MiniLM-L6-v2")` returns (sentence-transformers'
  Transformer -> mean Pooling -> Normalize, max 256 tokens) with transformers over the local
  folder, because the Hugging Face hub is out of reach and sentence-transformers is not needed
  for three modules (checked equal to sentence-transformers 6.3.0's `encode`). The cache's one
  departure from its defaults: its LRU eviction's size (default 1,000 entries) is raised above
  the entries put, so no entry is dropped before it is asked for.
  Protocol: per file and half, one fresh cache holding every distinct text_a with its own answer
  ("A<n>"); then each text_b is asked. Served right: text_a's own answer comes back; served
  wrong: any answer for a near miss / non-duplicate, or another pair's answer for a paraphrase.
- `gptcache@tuned`: the same, with `similarity_threshold` set to the lowest value that serves at
  most 1% of the tuning halves' near misses (the hand-written files together) and at most 1% of
  QQP's tuning non-duplicates.
  What the threshold means: `SearchDistanceEvaluation` scores a hit as 4 - d where d is faiss'
  squared L2 distance, clipped to [0, 4], and serves it when score >= 4 * threshold; on unit
  vectors d = 2 - 2 cos, so threshold t serves cos >= 2t - 1: the default 0.8 is cosine 0.6.
- `cosine:<embedder>`: one pair at a time, text_b served when cos(text_a, text_b) >= the
  threshold chosen on the tuning halves by the same 1% / 1% rule. Embedders: all-MiniLM-L6-v2
  (models/minilm), all-mpnet-base-v2 and bge-small-en-v1.5 where their folders exist
  (scripts/fetch-peer-embedders.sh); pooling (mean or CLS) read from each folder's 1_Pooling.

Held-out figures per system: paraphrases served per kind and overall, near misses served per kind
and overall, QQP duplicates and non-duplicates served; ROC AUC of the cosine on every held-out
set (GPTCache's score is monotone in MiniLM's cosine, so its AUC is `cosine:minilm`'s).

Needs torch, transformers, numpy, and gptcache + faiss-cpu (pip). Run it niced: embedding QQP
with mpnet is minutes of CPU.
Usage: bench-semantic-peers.py [--qqp-limit 4000] [--json OUT] [--peer-models DIR]
                               [--embedder NAME=DIR ...] [--emb-cache DIR] [--no-gptcache]
"""
import argparse
import atexit
import hashlib
import json
import os
import shutil
import sys
import tempfile
import time
from collections import OrderedDict

import numpy as np

import semantic_pairs

DATA = "data/semantic-cache"
HAND = ["nearmiss.json", "reworded-paraphrases.json", "reworded-nearmiss.json"]
QQP = "similiar_qqp_full.json.gz"
MAX_WRONG = 0.01
GPTCACHE_DEFAULT = 0.8


def read_pairs(path):
    return [
        {"kind": p.get("kind"), "a": p["text_a"], "b": p["text_b"], "label": int(p["label"]) == 1}
        for p in semantic_pairs.read_pairs(path)
    ]


def held_out(p):
    return semantic_pairs.held_out(p["a"], p["b"])


def split(pairs, limit=None):
    halves = {"tuning": [], "held_out": []}
    for p in pairs:
        halves["held_out" if held_out(p) else "tuning"].append(p)
    if limit:
        halves = {k: v[:limit] for k, v in halves.items()}
    return halves


# ---------------------------------------------------------------- embedders


class Embedder:
    """A sentence-transformers folder run with transformers: Transformer -> Pooling (mean or
    CLS, from 1_Pooling/config.json) -> L2 normalisation, as `SentenceTransformer.encode`."""

    def __init__(self, name, folder, cache_dir=None):
        import torch
        from transformers import AutoModel, AutoTokenizer

        self.name, self.folder, self.torch = name, folder, torch
        self.tok = AutoTokenizer.from_pretrained(folder)
        self.model = AutoModel.from_pretrained(folder).eval()
        pooling = os.path.join(folder, "1_Pooling", "config.json")
        self.cls = os.path.exists(pooling) and json.load(open(pooling)).get("pooling_mode_cls_token", False)
        st = os.path.join(folder, "sentence_bert_config.json")
        self.max_len = json.load(open(st)).get("max_seq_length", 512) if os.path.exists(st) else 512
        self.cache_dir = cache_dir
        self.memo = {}

    def _cache_path(self):
        """One file per model folder, holding every text embedded so far."""
        h = hashlib.sha256()
        h.update(os.path.abspath(self.folder).encode() + b"\0")
        h.update(str(os.path.getsize(os.path.join(self.folder, "model.safetensors"))).encode())
        return os.path.join(self.cache_dir, f"{self.name}-{h.hexdigest()[:16]}.npz")

    def _load_cache(self):
        path = self._cache_path()
        if os.path.exists(path):
            with np.load(path) as z:
                self.memo.update(zip(z["texts"].tolist(), z["vecs"]))

    def encode(self, texts, bs=64):
        """Embed texts (unit vectors), remembering each for `vector`."""
        if self.cache_dir and not self.memo:
            self._load_cache()
        todo = sorted({t for t in texts if t not in self.memo}, key=lambda t: (len(t), t))
        if not todo:
            return
        out, t0 = [], time.time()
        with self.torch.inference_mode():
            for i in range(0, len(todo), bs):
                enc = self.tok(todo[i : i + bs], padding=True, truncation=True,
                               max_length=self.max_len, return_tensors="pt")
                hidden = self.model(**enc).last_hidden_state
                if self.cls:
                    v = hidden[:, 0]
                else:
                    mask = enc["attention_mask"].unsqueeze(-1).to(hidden.dtype)
                    v = (hidden * mask).sum(1) / mask.sum(1).clamp(min=1e-9)
                out.append(self.torch.nn.functional.normalize(v, dim=-1).numpy())
        self.memo.update(zip(todo, np.concatenate(out).astype(np.float32)))
        if len(todo) > 1:
            print(f"  {self.name}: {len(todo)} texts in {time.time() - t0:.0f} s", file=sys.stderr)
        if self.cache_dir and len(todo) > 1:
            os.makedirs(self.cache_dir, exist_ok=True)
            texts = list(self.memo)
            np.savez(self._cache_path(), texts=np.array(texts), vecs=np.stack([self.memo[t] for t in texts]))

    def vector(self, text):
        if text not in self.memo:
            self.encode([text])
        return self.memo[text]

    @property
    def dimension(self):
        return self.model.config.hidden_size


def gptcache_embedding(embedder):
    """GPTCache's `BaseEmbedding` over an `Embedder`: what `SBERT(model).to_embeddings` gives."""
    from gptcache.embedding.base import BaseEmbedding

    class MiniLMEmbedding(BaseEmbedding):
        def to_embeddings(self, data, **_):
            return np.asarray(embedder.vector(data), dtype="float32")

        @property
        def dimension(self):
            return embedder.dimension

    return MiniLMEmbedding()


# ---------------------------------------------------------------- scoring


def pick(neg_scores, max_wrong=MAX_WRONG):
    """The lowest threshold (score >= t serves) that serves at most max_wrong of neg_scores."""
    neg = np.sort(np.asarray(neg_scores, dtype=np.float64))[::-1]
    if len(neg) == 0:
        return -np.inf
    k = int(np.floor(max_wrong * len(neg)))
    return float(np.nextafter(neg[k], np.inf)) if k < len(neg) else float(neg.min())


def roc_auc(scores, labels):
    """Mann-Whitney U with tied scores sharing their average rank."""
    s, y = np.asarray(scores, dtype=np.float64), np.asarray(labels, dtype=bool)
    npos, nneg = int(y.sum()), int((~y).sum())
    if not npos or not nneg:
        return None
    order = np.argsort(s, kind="mergesort")
    ranks = np.empty(len(s))
    sorted_s = s[order]
    i = 0
    while i < len(s):
        j = i
        while j + 1 < len(s) and sorted_s[j + 1] == sorted_s[i]:
            j += 1
        ranks[order[i : j + 1]] = (i + j) / 2 + 1
        i = j + 1
    return float((ranks[y].sum() - npos * (npos + 1) / 2) / (npos * nneg))


def frac(n, d):
    return {"served": int(n), "of": int(d), "rate": (n / d) if d else None}


def tally(pairs, right, wrong):
    """Per kind and overall: paraphrases (label 1) served right; near misses (label 0) served;
    paraphrases served another pair's answer."""
    out = {"paraphrases": {}, "near_misses": {}, "paraphrases_served_other": None}
    for label, key in ((True, "paraphrases"), (False, "near_misses")):
        idx = [i for i, p in enumerate(pairs) if p["label"] == label]
        hits = right if label else wrong
        kinds = OrderedDict()
        for i in idx:
            kinds.setdefault(pairs[i]["kind"] or "-", []).append(i)
        out[key] = {"overall": frac(sum(hits[i] for i in idx), len(idx))}
        out[key]["kinds"] = {k: frac(sum(hits[i] for i in v), len(v)) for k, v in kinds.items()}
    pos = [i for i, p in enumerate(pairs) if p["label"]]
    out["paraphrases_served_other"] = frac(sum(wrong[i] for i in pos), len(pos))
    return out


# ---------------------------------------------------------------- GPTCache


def gptcache_run(pairs, embedding, threshold, workdir):
    """One fresh GPTCache holding every distinct text_a of `pairs`; each text_b asked once.
    Returns (answer index served or None, score 0..1 as GPTCache's hit_callback reports it)."""
    from gptcache import Cache, Config
    from gptcache.adapter.api import get, init_similar_cache
    from gptcache.manager import manager_factory

    answers = {}
    for p in pairs:
        answers.setdefault(p["a"], len(answers))
    d = tempfile.mkdtemp(dir=workdir)
    cache = Cache()
    # manager_factory's own `max_size` does not reach its memory eviction (gptcache 0.1.44
    # reads eviction_params["max_size"], default 1,000): without this a cache of QQP's
    # questions silently keeps its last 1,000 or fewer.
    manager = manager_factory("sqlite,faiss", data_dir=d,
                              eviction_params={"max_size": len(answers) + 1000},
                              vector_params={"dimension": embedding.dimension})
    init_similar_cache(data_dir=d, cache_obj=cache, embedding=embedding, data_manager=manager,
                       config=Config(similarity_threshold=threshold))
    questions = list(answers)
    cache.import_data(questions, [f"A{answers[q]}" for q in questions])
    assert manager.v.count() == len(questions), (manager.v.count(), len(questions))
    served = []
    for p in pairs:
        seen = []
        got = get(p["b"], cache_obj=cache, hit_callback=seen.extend)
        idx = int(got[1:]) if isinstance(got, str) and got.startswith("A") else None
        served.append((idx, float(seen[0][1]) if seen else None))
    manager.close()
    return served, answers


def gptcache_pick(neg_scores):
    """`pick` for GPTCache's threshold t: it serves when 4 - d >= 4t, compared in float32 (the
    distance is numpy float32 and NumPy 2 keeps the Python float weak), so t must clear the
    highest score kept out by one float32 step of 4t, not by one float64 step of t."""
    neg = np.sort(np.asarray(neg_scores, dtype=np.float64))[::-1]
    k = int(np.floor(MAX_WRONG * len(neg)))
    if k >= len(neg):
        return 0.0
    rank = np.float32(4 * neg[k])
    return float(np.nextafter(rank, np.float32(np.inf))) / 4


def gptcache_outcome(pairs, served, answers):
    right = [s[0] is not None and s[0] == answers[p["a"]] for p, s in zip(pairs, served)]
    wrong = [s[0] is not None and (not p["label"] or s[0] != answers[p["a"]])
             for p, s in zip(pairs, served)]
    return right, wrong


# ---------------------------------------------------------------- report


def cell(f):
    if f is None or f["rate"] is None:
        return "-"
    return f"{100 * f['rate']:.1f}% {f['served']}/{f['of']}"


def table(title, rows, systems):
    width = max(len(r[0]) for r in rows) + 2
    print(f"\n{title}")
    col = max(18, max(len(s) for s in systems) + 2)
    print(" " * width + "".join(f"{s:>{col}}" for s in systems))
    for name, cells in rows:
        print(f"{name:<{width}}" + "".join(f"{c:>{col}}" for c in cells))


def report(result):
    systems = list(result["systems"])
    meta = result["meta"]
    print(f"\nthresholds (chosen on tuning halves: <= {MAX_WRONG:.0%} near misses served, "
          f"<= {MAX_WRONG:.0%} QQP non-duplicates served)")
    for s in systems:
        r = result["systems"][s]
        extra = f"  cosine {r['cosine_equivalent']:.4f}" if "cosine_equivalent" in r else ""
        if "threshold_hand" in r:
            extra += (f"  (hand-written alone: {r['threshold_hand']:.4f}, "
                      f"QQP alone: {r['threshold_qqp']:.4f})")
        print(f"  {s:<22} {r['threshold']:.4f}{extra}")
    sets = list(result["held_out"]["hand"].keys())
    for name in sets:
        rows = []
        first = result["systems"][systems[0]]["held_out"][name]
        for key, label in (("paraphrases", "paraphrases"), ("near_misses", "near misses")):
            for kind in first[key]["kinds"]:
                rows.append((f"  {kind}", [cell(result["systems"][s]["held_out"][name][key]["kinds"][kind])
                                           for s in systems]))
            rows.append((f"{label} served", [cell(result["systems"][s]["held_out"][name][key]["overall"])
                                             for s in systems]))
        rows.append(("paraphrases served another's answer",
                     [cell(result["systems"][s]["held_out"][name]["paraphrases_served_other"]) for s in systems]))
        rows.append(("ROC AUC", [f"{result['systems'][s]['held_out'][name].get('auc') or float('nan'):.3f}"
                                 for s in systems]))
        n = result["held_out"]["hand"][name]
        table(f"held out: {name} ({n} pairs)", rows, systems)
    if "qqp" in result["held_out"]:
        q = result["held_out"]["qqp"]
        rows = [
            ("duplicates served", [cell(result["systems"][s]["held_out"]["qqp"]["paraphrases"]["overall"])
                                   for s in systems]),
            ("non-duplicates served", [cell(result["systems"][s]["held_out"]["qqp"]["near_misses"]["overall"])
                                       for s in systems]),
            ("duplicates served another's answer",
             [cell(result["systems"][s]["held_out"]["qqp"]["paraphrases_served_other"]) for s in systems]),
            ("ROC AUC", [f"{result['systems'][s]['held_out']['qqp'].get('auc') or float('nan'):.3f}"
                         for s in systems]),
        ]
        table(f"held out: QQP, the first {meta['qqp_limit']} pairs of the held-out half in file order "
              f"({q} pairs)", rows, systems)


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--data", default=DATA)
    ap.add_argument("--qqp-limit", type=int, default=4000,
                    help="first N pairs of each QQP half, in file order (0: all)")
    ap.add_argument("--peer-models", default="out/peer-models",
                    help="where scripts/fetch-peer-embedders.sh put mpnet and bge-small")
    ap.add_argument("--embedder", action="append", default=[], metavar="NAME=DIR",
                    help="an embedder folder (replaces the defaults when given)")
    ap.add_argument("--emb-cache", help="keep embeddings here between runs")
    ap.add_argument("--no-gptcache", action="store_true")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--json", help="write every figure here")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)

    embedders = [e.split("=", 1) for e in args.embedder] or [
        ("minilm", "models/minilm"),
        ("bge-small", os.path.join(args.peer_models, "bge-small-en-v1.5")),
        ("mpnet", os.path.join(args.peer_models, "all-mpnet-base-v2")),
    ]
    skipped = [n for n, d in embedders if not os.path.exists(os.path.join(d, "config.json"))]
    for n in skipped:
        print(f"skipping {n}: no model folder", file=sys.stderr)
    embedders = [(n, d) for n, d in embedders if n not in skipped]

    hand = OrderedDict()
    for f in HAND:
        path = os.path.join(args.data, f)
        if os.path.exists(path):
            hand[f] = split(read_pairs(path))
    qqp_path = os.path.join(args.data, QQP)
    qqp = split(read_pairs(qqp_path), args.qqp_limit or None) if os.path.exists(qqp_path) else None

    sets = OrderedDict((name, h) for name, h in hand.items())
    if len(hand) > 1:
        sets["hand-written, all files"] = {k: [p for h in hand.values() for p in h[k]]
                                           for k in ("tuning", "held_out")}
    result = {
        "meta": {
            "files": list(hand), "qqp_limit": args.qqp_limit,
            "split": "FNV-1a 64 over text_a, 0, text_b; held out when (h % 10000)/10000 < 0.5",
            "max_wrong": MAX_WRONG, "embedders": dict(embedders), "skipped": skipped,
            "packages": {}, "started": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        },
        "held_out": {"hand": {n: len(h["held_out"]) for n, h in sets.items()}},
        "tuning": {"hand": {n: len(h["tuning"]) for n, h in sets.items()}},
        "systems": OrderedDict(),
    }
    if qqp:
        result["held_out"]["qqp"] = len(qqp["held_out"])
        result["tuning"]["qqp"] = len(qqp["tuning"])
    import transformers

    result["meta"]["packages"].update(torch=torch.__version__, transformers=transformers.__version__,
                                      numpy=np.__version__)

    tune_hand = [p for h in hand.values() for p in h["tuning"]]
    every = [p for h in hand.values() for half in h.values() for p in half]
    if qqp:
        every += qqp["tuning"] + qqp["held_out"]
    texts = sorted({t for p in every for t in (p["a"], p["b"])})

    loaded = {}
    for name, folder in embedders:
        h = hashlib.sha256()
        with open(os.path.join(folder, "model.safetensors"), "rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                h.update(block)
        result["meta"]["embedders"][name] = {"folder": folder, "model.safetensors sha256": h.hexdigest()}
        e = Embedder(name, folder, args.emb_cache)
        e.encode(texts)
        loaded[name] = e

        def cos(pairs, e=e):
            return np.array([float(np.dot(e.vector(p["a"]), e.vector(p["b"]))) for p in pairs])

        t_hand = pick(cos([p for p in tune_hand if not p["label"]]))
        t_qqp = pick(cos([p for p in qqp["tuning"] if not p["label"]])) if qqp else -np.inf
        # Both limits (this benchmark's rule), and QQP's alone (`frugal eval-cache`'s plain
        # cosine, which reports the near misses at the threshold QQP chose).
        for label, t in ((f"cosine:{name}", max(t_hand, t_qqp)), (f"cosine:{name}@qqp", t_qqp)):
            if label.endswith("@qqp") and not qqp:
                continue
            sysres = {"threshold": t, "threshold_hand": t_hand, "threshold_qqp": t_qqp,
                      "tuning": {}, "held_out": {}}
            for setname, h in list(sets.items()) + ([("qqp", qqp)] if qqp else []):
                for half in ("tuning", "held_out"):
                    pairs = h[half]
                    c = cos(pairs)
                    hit = list(c >= t)
                    r = tally(pairs, hit, [x and not p["label"] for x, p in zip(hit, pairs)])
                    r["auc"] = roc_auc(c, [p["label"] for p in pairs])
                    sysres[half][setname] = r
            result["systems"][label] = sysres

    if not args.no_gptcache:
        import faiss
        import gptcache

        result["meta"]["packages"].update(gptcache=getattr(gptcache, "__version__", "?"),
                                          faiss=faiss.__version__)
        minilm = loaded.get("minilm") or Embedder("minilm", "models/minilm", args.emb_cache)
        embedding = gptcache_embedding(minilm)
        work = tempfile.mkdtemp(prefix="gptcache-bench-")
        # Each GPTCache flushes its store at exit; atexit runs last what it was given first.
        atexit.register(shutil.rmtree, work, ignore_errors=True)
        runs = list(sets.items()) + ([("qqp", qqp)] if qqp else [])

        # Scores of every ask at threshold 0 (everything found is served), to choose the tuned
        # threshold on the tuning halves the way the cosine systems choose theirs.
        neg_hand, neg_qqp = [], []
        for setname, h in runs:
            if setname == "hand-written, all files":
                continue
            served, _ = gptcache_run(h["tuning"], embedding, 0.0, work)
            negs = [s[1] for s, p in zip(served, h["tuning"]) if not p["label"] and s[1] is not None]
            (neg_qqp if setname == "qqp" else neg_hand).extend(negs)
        t_hand, t_qqp = gptcache_pick(neg_hand), (gptcache_pick(neg_qqp) if qqp else 0.0)
        tuned = min(1.0, max(t_hand, t_qqp))
        for label, threshold in (("gptcache@0.8", GPTCACHE_DEFAULT), ("gptcache@tuned", tuned)):
            sysres = {"threshold": threshold, "cosine_equivalent": 2 * threshold - 1,
                      "tuning": {}, "held_out": {}}
            if label == "gptcache@tuned":
                sysres.update(threshold_hand=t_hand, threshold_qqp=t_qqp)
            for half in ("tuning", "held_out"):
                outcome = {}
                for setname, h in runs:
                    if setname == "hand-written, all files":
                        # One cache per file, as each file is asked alone: the pooled figure
                        # is the files' outcomes together.
                        right, wrong = ([x for f in hand for x in outcome[f][i]] for i in (0, 1))
                    else:
                        served, answers = gptcache_run(h[half], embedding, threshold, work)
                        right, wrong = gptcache_outcome(h[half], served, answers)
                    outcome[setname] = (right, wrong)
                    r = tally(h[half], right, wrong)
                    r["auc"] = result["systems"].get("cosine:minilm", {}).get(half, {}).get(setname, {}).get("auc")
                    sysres[half][setname] = r
            result["systems"][label] = sysres
        # GPTCache first in the table: it is the peer the issue names.
        for label in ("gptcache@tuned", "gptcache@0.8"):
            result["systems"].move_to_end(label, last=False)

    report(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
        print(f"\nwrote {args.json}", file=sys.stderr)


if __name__ == "__main__":
    main()
