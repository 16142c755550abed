#!/usr/bin/env python3
"""Train the semantic cache's paraphrase verifier: a small cross-encoder that reads a cached
question and an asked one together and says whether the same answer is right for both.

The model is the first LAYERS layers of all-MiniLM-L6-v2 (the cache's own embedder, so the
base weights are already on every machine that runs the cache) with a LoRA adapter on every
linear layer and one linear head on the mean of the last layer. The input is
[CLS] cached [SEP] asked [SEP], token types 0 then 1. What ships is the adapter and the head,
data/semantic-cache/verifier.safetensors (about a megabyte): frugal merges it into the base
weights when it loads (`frugal_semantic::verify`).

Data (all split exactly as `frugal eval-cache` splits them, by an FNV-1a hash of each pair;
the held-out half is never read here, and a fifth of the tuning half, the calibration split,
is kept out of training so that `frugal eval-cache` chooses and calibrates on unseen pairs):
- QQP (data/semantic-cache/similiar_qqp_full.json.gz): the tuning half, less every pair that
  shares a question with the calibration or held-out splits.
- the hand-written pairs (nearmiss.json, reworded-*.json): their tuning halves, repeated
  (HAND_WEIGHT) since they are few and are the shapes users reword in.
- adversarial pairs in the spirit of PAWS, made here from the training paraphrases: one word
  of the asked question replaced by its WordNet antonym or a sibling of its category
  ("wrote" -> "illustrated" is not, "Paris" -> "Rome" is), or two of its content words
  swapped. Label: different. They teach the model that one word can change the answer.

Usage: train-verifier.py [--layers 3] [--epochs 1] [--limit N] OUT_DIR
The bundled file came from `--limit 16000` (one epoch, about 33 minutes on 2 shared vCPUs);
then `frugal eval-cache --verifier OUT_DIR/verifier.safetensors --calibrate` writes its
calibration and floor. Needs torch, transformers, peft and safetensors.
"""
import argparse
import glob
import gzip
import json
import os
import random
import re
import time

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import BertConfig, BertModel, BertTokenizerFast

import semantic_pairs

BASE = "models/minilm"
QQP = "data/semantic-cache/similiar_qqp_full.json.gz"
HAND = ["data/semantic-cache/nearmiss.json"] + sorted(glob.glob("data/semantic-cache/reworded-*.json"))
LEXICON = "data/lexicon/wordnet.tsv.gz"
HAND_WEIGHT = 6
MAX_LEN = 96
STOP = set("""a an the of to in on for with by at from and or is are was were be been do does did
how what which who whom whose why when where can could should would will shall may might must i
me my we our you your it its this that these those there their they them he she his her as
about into than then so if not no any some all more most very just get""".split())


def read_qqp(path):
    return [(p["text_a"], p["text_b"], int(p["label"]) == 1) for p in semantic_pairs.read_pairs(path)]


def read_hand(path):
    return [(p["text_a"], p["text_b"], int(p["label"]) == 1, p["kind"]) for p in json.load(open(path))]


def split(a, b):
    """The halves of `frugal eval-cache`, and its calibration fifth of the tuning half."""
    if semantic_pairs.held_out(a, b):
        return "held_out"
    h = semantic_pairs.pair_hash(a, b)
    return "calib" if (h // 10_000) % 5 == 0 else "train"


def norm(q):
    return " ".join(q.lower().split())


class WordNet:
    """Antonyms and category siblings from frugal's WordNet subset (format in
    scripts/build-lexicon.py)."""

    def __init__(self, path):
        section, synsets, lemmas, self.antonyms = None, [], {}, {}
        for line in gzip.open(path, "rt"):
            if line.startswith("#"):
                continue
            f = line.rstrip("\n").split("\t")
            if len(f) == 2 and f[0] in "SLPX" and f[1].isdigit():
                section = f[0]
                continue
            if section == "S":
                synsets.append((f[0], [int(x) for x in f[1].split()] if f[1] else []))
            elif section == "L":
                lemmas[f[0]] = [int(x) for x in f[1].split()] if f[1] else []
            elif section == "P" and f[0] == "!":
                self.antonyms.setdefault(f[2], []).append(f[4])
                self.antonyms.setdefault(f[4], []).append(f[2])
        self.lemmas = lemmas
        children = {}
        by_synset = {}
        for lemma, ids in lemmas.items():
            if "-" in lemma or "'" in lemma or not lemma.isalpha():
                continue
            for s in ids[:1]:
                by_synset.setdefault(s, []).append(lemma)
        for s, (_, hyper) in enumerate(synsets):
            for h in hyper[:1]:
                children.setdefault(h, []).append(s)
        self.synsets = synsets
        self.children = children
        self.by_synset = by_synset

    def siblings(self, word):
        ids = self.lemmas.get(word)
        if not ids:
            return []
        first = ids[0]
        hyper = self.synsets[first][1]
        if not hyper:
            return []
        out = []
        for s in self.children.get(hyper[0], []):
            if s != first:
                out.extend(w for w in self.by_synset.get(s, []) if w != word)
        return out


def corrupt(text, wn, rng):
    """A near miss of `text`: one word replaced by an antonym or a category sibling, or two
    content words swapped. None when the text offers neither."""
    words = re.findall(r"\w+|\W+", text)
    content = [i for i, w in enumerate(words) if w.isalpha() and w.lower() not in STOP and len(w) > 2]
    if not content:
        return None
    rng.shuffle(content)
    mode = rng.random()
    if mode < 0.25 and len(content) >= 2:
        i, j = content[0], content[1]
        if words[i].lower() != words[j].lower():
            words[i], words[j] = words[j], words[i]
            return "".join(words)
    for i in content:
        w = words[i].lower()
        options = wn.antonyms.get(w, []) if mode < 0.5 else []
        options = options or wn.siblings(w)
        options = [o for o in options if o != w]
        if options:
            o = rng.choice(options)
            words[i] = o.capitalize() if words[i][0].isupper() else o
            return "".join(words)
    return None


class Verifier(torch.nn.Module):
    def __init__(self, layers):
        super().__init__()
        config = BertConfig.from_pretrained(BASE)
        config.num_hidden_layers = layers
        self.bert = BertModel(config, add_pooling_layer=False)
        state = {k: v.float() for k, v in load_file(f"{BASE}/model.safetensors").items()}
        state = {
            k: v
            for k, v in state.items()
            if not k.startswith("pooler")
            and k != "embeddings.position_ids"
            and not (k.startswith("encoder.layer.") and int(k.split(".")[2]) >= layers)
        }
        missing, unexpected = self.bert.load_state_dict(state, strict=False)
        assert not unexpected and all("position_ids" in m for m in missing), (missing, unexpected)
        self.head = torch.nn.Linear(config.hidden_size, 1)

    def forward(self, enc):
        out = self.bert(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).to(out.dtype)
        return self.head((out * mask).sum(1) / mask.sum(1)).squeeze(-1)


def encode(tok, batch):
    return tok([x[0] for x in batch], [x[1] for x in batch], padding=True, truncation="longest_first",
               max_length=MAX_LEN, return_tensors="pt")


@torch.no_grad()
def scores(tok, model, pairs, bs=64):
    """Logits in the pairs' order, computed in batches of similar lengths (less padding)."""
    model.eval()
    order = sorted(range(len(pairs)), key=lambda i: len(pairs[i][0]) + len(pairs[i][1]))
    out = np.empty(len(pairs), dtype=np.float32)
    for i in range(0, len(order), bs):
        idx = order[i : i + bs]
        out[idx] = model(encode(tok, [pairs[j] for j in idx])).numpy()
    return out


def auc(score, label):
    order = np.argsort(score)
    ranks = np.empty(len(score))
    ranks[order] = np.arange(1, len(score) + 1)
    pos = label.sum()
    neg = len(label) - pos
    return float((ranks[label].sum() - pos * (pos + 1) / 2) / max(pos * neg, 1))


def export(model, path, meta):
    """LoRA as (A, B * scale) per linear layer, named after the base weight it adds to; the head."""
    out = {}
    for name, mod in model.bert.named_modules():
        if hasattr(mod, "lora_A") and "default" in mod.lora_A:
            base = name.split("base_model.model.", 1)[-1]
            scale = mod.scaling["default"]
            out[f"{base}.lora_a"] = mod.lora_A["default"].weight.detach().float().contiguous()
            out[f"{base}.lora_b"] = (mod.lora_B["default"].weight.detach().float() * scale).contiguous()
    out["head.weight"] = model.head.weight.detach().float().reshape(-1).contiguous()
    out["head.bias"] = model.head.bias.detach().float().contiguous()
    save_file(out, path, metadata={k: str(v) for k, v in meta.items()})


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out_dir")
    ap.add_argument("--layers", type=int, default=3)
    ap.add_argument("--epochs", type=int, default=1)
    ap.add_argument("--rank", type=int, default=16)
    ap.add_argument("--limit", type=int, default=0, help="QQP training pairs at most (a smoke test)")
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    torch.set_num_threads(args.threads)
    logf = open(f"{args.out_dir}/train.log", "w")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    rng = random.Random(7)
    torch.manual_seed(7)
    tok = BertTokenizerFast.from_pretrained(BASE)
    qqp = read_qqp(QQP)
    parts = {"train": [], "calib": [], "held_out": []}
    for a, b, y in qqp:
        parts[split(a, b)].append((a, b, y))
    kept_out = {norm(q) for part in ("calib", "held_out") for p in parts[part] for q in p[:2]}
    qqp_train = [p for p in parts["train"] if norm(p[0]) not in kept_out and norm(p[1]) not in kept_out]
    rng.shuffle(qqp_train)
    if args.limit:
        qqp_train = qqp_train[: args.limit]
    hand = {"train": [], "calib": []}
    for path in HAND:
        for a, b, y, kind in read_hand(path):
            s = split(a, b)
            if s in hand:
                hand[s].append((a, b, y, kind))
    wn = WordNet(LEXICON)
    adversarial = []
    positives = [(a, b) for a, b, y in qqp_train if y] + [(a, b) for a, b, y, _ in hand["train"] if y]
    for a, b in positives:
        for src, tgt in ((a, b), (b, a)):
            c = corrupt(tgt, wn, rng)
            if c and norm(c) != norm(tgt):
                adversarial.append((src, c, False))
                break
    adversarial = adversarial[: len(positives) // 2]
    data = qqp_train + [(a, b, y) for a, b, y, _ in hand["train"]] * HAND_WEIGHT + adversarial
    log(f"QQP train {len(qqp_train)} (of {len(parts['train'])}), hand-written train {len(hand['train'])} "
        f"x{HAND_WEIGHT}, adversarial {len(adversarial)}; {len(data)} pairs an epoch; "
        f"calibration: QQP {len(parts['calib'])}, hand-written {len(hand['calib'])}")
    for a, b, _ in adversarial[:8]:
        log(f"  adversarial: {a!r} / {b!r}")

    from peft import LoraConfig, get_peft_model

    model = Verifier(args.layers)
    model.bert = get_peft_model(model.bert, LoraConfig(
        r=args.rank, lora_alpha=2 * args.rank, lora_dropout=0.1,
        target_modules=["query", "key", "value", "dense"]))
    head = list(model.head.parameters())
    body = [p for p in model.bert.parameters() if p.requires_grad]
    lr = 5e-4
    opt = torch.optim.AdamW([{"params": body, "lr": lr}, {"params": head, "lr": 1e-3}], weight_decay=0.01)
    bs = 32
    steps = args.epochs * ((len(data) + bs - 1) // bs)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[lr, 1e-3], total_steps=steps, pct_start=0.06)
    t0 = time.time()
    step = 0
    for epoch in range(args.epochs):
        model.train()
        order = data[:]
        rng.shuffle(order)
        total = 0.0
        for i in range(0, len(order), bs):
            batch = [(b, a, y) if rng.random() < 0.5 else (a, b, y) for a, b, y in order[i : i + bs]]
            y = torch.tensor([float(x[2]) for x in batch])
            loss = torch.nn.functional.binary_cross_entropy_with_logits(model(encode(tok, batch)), y)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(body + head, 1.0)
            opt.step()
            sched.step()
            total += loss.item() * len(batch)
            step += 1
            if step % 200 == 0:
                log(f"epoch {epoch + 1} step {step}/{steps}: loss {total / (i + len(batch)):.4f} "
                    f"({time.time() - t0:.0f} s)")
        log(f"epoch {epoch + 1}/{args.epochs}: loss {total / len(order):.4f} ({time.time() - t0:.0f} s)")

    calib_q = parts["calib"]
    s = scores(tok, model, calib_q)
    log(f"calibration QQP AUC {auc(s, np.array([p[2] for p in calib_q])):.4f}")
    hs = scores(tok, model, [(a, b) for a, b, _, _ in hand["calib"]])
    hl = np.array([p[2] for p in hand["calib"]])
    log(f"calibration hand-written AUC {auc(hs, hl):.4f}")
    export(model, f"{args.out_dir}/verifier.safetensors", {
        "base": "sentence-transformers/all-MiniLM-L6-v2", "layers": args.layers, "rank": args.rank,
        "max_tokens": MAX_LEN, "epochs": args.epochs, "qqp_train": len(qqp_train),
        "hand_train": len(hand["train"]), "adversarial": len(adversarial),
    })
    # Reference logits for the Rust forward's parity test.
    ref = [(a, b) for a, b, _, _ in hand["calib"][:12]] + [(a, b) for a, b, _ in calib_q[:12]]
    json.dump([{"cached": a, "asked": b, "logit": float(x)} for (a, b), x in zip(ref, scores(tok, model, ref))],
              open(f"{args.out_dir}/reference.json", "w"), indent=1)
    log(f"exported to {args.out_dir} ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
