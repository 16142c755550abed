"""Labelled question pairs as `frugal eval-cache` reads and splits them, for the scripts that
measure the semantic cache beside it (bench-semantic-peers.py, replay-semantic.py)."""
import gzip
import io
import json
import tarfile


def read_pairs(path):
    """A JSON array of {kind?, text_a, text_b, label}: plain, gzip, or a gzip'd tar holding it."""
    raw = open(path, "rb").read()
    if raw[:2] == b"\x1f\x8b":
        raw = gzip.decompress(raw)
        if raw[257:262] == b"ustar":
            with tarfile.open(fileobj=io.BytesIO(raw)) as tar:
                member = next(m for m in tar.getmembers() if m.name.endswith(".json"))
                raw = tar.extractfile(member).read()
    return json.loads(raw)


def pair_hash(a, b):
    """FNV-1a over text_a, a zero byte and text_b: `frugal_semantic::eval::pair_hash`."""
    h = 0xCBF29CE484222325
    for byte in a.encode() + b"\0" + b.encode():
        h = ((h ^ byte) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return h


def held_out(a, b):
    """In the held-out half, as `frugal_semantic::eval::is_held_out(p, 0.5)`."""
    return (pair_hash(a, b) % 10_000) / 10_000 < 0.5
